# Two commands do everything on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export PATH := $(abspath $(BIN)):$(abspath node_modules/.bin):$(PATH)

.PHONY: venv browser demo test test-unit test-integration test-infra synth deploy lint docs bench bench-quota bench-scaling bench-recovery-baseline bench-large bench-burst bench-batch bench-first-run bench-transactions soak clean

# The install: requirements.txt holds every pin, uv's too. uv (installed from the package registry into the venv
# with the venv's pip) installs them; when uv cannot be installed or fails, pip installs the same file. Compiled to
# bytecode at install, as pip does: worker processes start with -B when PYTHONDONTWRITEBYTECODE is set (as on CI), so
# without it every one of them would compile boto3 and the rest from source each time it starts.
# INSTALLER=pip skips uv (bench/first_run.py measures both).
INSTALLER ?= uv
UV_PIN = $$(sed -n 's/^\(uv==[^ ]*\).*/\1/p' requirements.txt)
$(STAMP): requirements.txt pyproject.toml package.json package-lock.json
	$(PY) -m venv $(VENV)
	@if [ "$(INSTALLER)" = uv ] && $(BIN)/python -m pip install --quiet --disable-pip-version-check "$(UV_PIN)" \
	    && $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -r requirements.txt; then \
	  echo "installed the requirements with $$($(BIN)/uv --version)"; \
	else \
	  if [ "$(INSTALLER)" = uv ]; then echo "uv could not install the requirements: installing them with pip"; fi; \
	  $(BIN)/python -m pip install --quiet --upgrade pip && $(BIN)/python -m pip install --quiet -r requirements.txt \
	    && echo "installed the requirements with pip"; \
	fi
	npm ci --silent --no-audit --no-fund
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/review demo

# The status page's browser test (tests/integration/test_ui_browser.py) drives Debian's chromium and chromium-driver:
# installed here when missing and apt-get is usable (root); elsewhere the test skips with one line saying so.
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -qq chromium chromium-driver \
	      || { apt-get update -qq && apt-get install -y -qq chromium chromium-driver; } \
	      || echo "chromium could not be installed: the status page's browser test will skip"; \
	  else echo "no chromium, and apt-get is not usable here: the status page's browser test will skip"; fi; fi

test: lint browser
	$(BIN)/python -m pytest -n 2 --dist loadgroup -m "not soak" tests

# Tooling gate: ruff (incl. import order and complexity <= 15), mypy (pydantic plugin) over the
# shipped code, import-linter (the layers and import rules in pyproject.toml), and no `# type: ignore` without a reason after it on the same line.
lint: $(STAMP)
	$(BIN)/ruff check functions review_local infra tests bench app.py
	$(BIN)/mypy
	PYTHONPATH=functions:. $(BIN)/lint-imports --no-cache
	@! grep -rnE "type: ignore(\[[^]]*\])?[[:space:]]*$$" functions review_local infra app.py \
		|| { echo "error: a '# type: ignore' above has no reason after it on the same line"; exit 1; }

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

test-integration: $(STAMP)
	$(BIN)/python -m pytest tests/integration

test-infra: $(STAMP)
	$(BIN)/python -m pytest tests/infra

synth: $(STAMP)
	npx cdk synth -c profile=$${PROFILE:-prod} -c alarm_email=$${ALARM_EMAIL:-none} --quiet  # a look at the template: no subscriber unless ALARM_EMAIL

# A deploy that preflight gates: `review preflight --before-deploy` first (the account: the Powertools layer in the
# region, Lambda concurrency; the model answers; a deployed stack's alarm subscribers), and `cdk deploy` only when it
# exits 0. What the deploy itself repairs (a stack's stale SDK layer, its batch role) is printed, not blocking. Both get
# the same context: PROFILE (prod), STACK (ContractReview), ALARM_EMAIL (required in prod: an address, or none),
# MODEL_ID (the profile's unless set), FALLBACKS (the models a job falls back to, comma-separated: preflight checks
# each), REGION (else your AWS_REGION / profile's), WORKER (lambda | fargate: preflight then checks the ECS
# service-linked roles); CDK_ARGS adds more (-c daily_spend_cap_usd=N, -c model_tpm=N ...).
PROFILE ?= prod
STACK ?= ContractReview
deploy: $(STAMP)
	$(if $(REGION),AWS_REGION=$(REGION)) $(BIN)/review --stack $(STACK) preflight --before-deploy $(if $(MODEL_ID),--model-id $(MODEL_ID)) $(if $(FALLBACKS),--fallbacks $(FALLBACKS)) $(if $(WORKER),--worker $(WORKER))
	$(if $(REGION),AWS_REGION=$(REGION)) npx cdk deploy -c profile=$(PROFILE) -c stack_name=$(STACK) $(if $(ALARM_EMAIL),-c alarm_email=$(ALARM_EMAIL)) $(if $(MODEL_ID),-c model_id=$(MODEL_ID)) $(if $(FALLBACKS),-c model_fallbacks=$(FALLBACKS)) $(if $(WORKER),-c worker=$(WORKER)) $(CDK_ARGS)

docs: $(STAMP)
	PYTHONPATH=functions $(BIN)/python -m contract_review.domain.policy > docs/error-codes.md
	PYTHONPATH=functions $(BIN)/python -m contract_review.domain.lifecycle > docs/job-states.md
	PYTHONPATH=functions $(BIN)/python -m contract_review.config.metrics > docs/metrics.md
	PYTHONPATH=functions $(BIN)/python -m contract_review.config.catalogue > docs/models.md
	PYTHONPATH=functions $(BIN)/python -c "import json; from contract_review.domain.messages import intake_json_schema; print(json.dumps(intake_json_schema(), indent=2))" > docs/intake-message.schema.json
	$(BIN)/python bench/publish.py

# At most 5 minutes on 2 cores: recovery and faults (one run per fault rate, without the 2-minute
# visibility-timeout baseline), then a ~100 KB contract under a tokens-per-minute quota on the simulated
# Bedrock, side by side: the old prompt layout, the cached layout, unpaced; targets print PASS/FAIL
# (bench/tokens.py). Beside the Powertools-alone baseline (bench/baseline): make bench-quota.
bench: $(STAMP)
	$(BIN)/python bench/run.py --quick --reps 1
	$(BIN)/python bench/tokens.py

# Beside the Powertools-alone baseline (bench/baseline: same workload, faults and kill) under a requests-per-
# minute quota: every bench/quota.py run on the 56 KB contract (~12 minutes on 2 cores: under the quota the
# baseline's chunks exhaust their fixed retries and come back after the visibility timeout).
bench-quota: $(STAMP)
	$(BIN)/python bench/quota.py --only before,concurrent,after,faults,baseline-clean,baseline

# Under the tokens-per-minute quota (bench/tokens.py, cached layout): the knee (makespan against the number of
# workers on 100 KB: 3, 4 = what config/fleet.py sizes, 6) and the scaling series (10 KB, 100 KB, 400 KB at
# the fleet's size); ~12 minutes on 2 cores.
bench-scaling: $(STAMP)
	$(BIN)/python bench/tokens.py --name tokens-knee --only cached --workers 3,4,6
	$(BIN)/python bench/tokens.py --name tokens-scaling --only cached --chars 10000,100000,400000 --timeout 900

bench-recovery-baseline: $(STAMP)
	$(BIN)/python bench/run.py

# A 5 MB and a 1.2 MB contract by s3_uri (leave `queued`, complete, match a fault-free run) and a 12 KB
# one behind a 2 MB one (fairness); ~30 minutes on 2 cores. Results in bench/results/large.json.
bench-large: $(STAMP)
	$(BIN)/python bench/large.py

# A burst of 1,000 and 10,000 contracts against the model quota and the fleet, the stall reconciler's old rule
# beside the new one (bench/burst_sim.py: a discrete-event simulation, no AWS; ~5 minutes on one core, most of it
# the old rule's 12 million duplicates). `bench/burst_calibrate.py` (~3 minutes, the local stack) re-measures
# what it is calibrated on; `bench/burst_sim.py --local` replays that flood. Results: bench/results/burst_sim*.json.
bench-burst: $(STAMP)
	$(BIN)/python bench/burst_sim.py

# One 100 KB contract on demand, then in batch, on embedded AWS (the batch stand-in): cost per 100 KB in both modes,
# their ratio, the batch cost against its bound (bench/README.md "On demand and in batch").
bench-batch: $(STAMP)
	$(BIN)/python bench/batch.py

# `make demo` on fresh clones of this checkout (committed work): uv with a cold package cache, then 3 warm runs, then
# pip cold and warm; each run installs its own venv, so this needs no venv here (~25 minutes on 2 cores). Results:
# bench/results/first-run.json, rendered into the README by `make docs`.
bench-first-run:
	$(PY) bench/first_run.py --installer uv,pip --warm 3,1

# Over 200 documents under every fault at once (transient, permanent, malformed output, duplicates,
# kill -9 and SIGSTOP of workers), each job checked against a fault-free run; ~15 minutes on 2 cores.
# Prints the counts that must be 0; results in bench/results/soak.json and soak.txt.
# What one DynamoDB transaction costs on the embedded AWS by table size, moto as shipped against the per-item
# rollback the embedded AWS installs (review_local/embedded.py); ~1 minute.
bench-transactions: $(STAMP)
	$(BIN)/python bench/embedded_transactions.py

soak: $(STAMP)
	$(BIN)/python -m pytest -m soak -s -q tests/soak

clean:
	rm -rf $(VENV) node_modules .review cdk.out
