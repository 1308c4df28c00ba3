"""The toolchain: the Node the CDK runs on, and `make deploy`.

package.json pins Node (the npm package `node`, an LTS release, not the machine's Node 20, past end of life), and
the CDK's jsii runtime is pointed at it (infra/__init__.py). `make deploy` (Makefile): `review preflight
--before-deploy` gates `cdk deploy`, and both get the same context.

Runs the real Makefile with make: `-n` for what it would run, then with stand-ins for `review` and `npx` (BIN=a
directory holding both: the Makefile calls $(BIN)/review and puts $(BIN) first on PATH, where `npx` is then found)
that record their arguments, the stand-in preflight exiting as told. `-o .venv/.installed`: the venv is not
(re)built.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CONTEXT = ["PROFILE=prod", "STACK=ContractReviewEu", "ALARM_EMAIL=oncall@example.com", "MODEL_ID=eu.anthropic.x",
           "REGION=eu-west-1", "WORKER=fargate"]

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


def test_the_cdk_runs_on_the_node_package_json_pins():
    import infra

    pinned = json.loads((ROOT / "package.json").read_text())["devDependencies"]["node"]
    assert int(pinned.split(".")[0]) in (22, 24)  # an LTS release (even major), not 20 (end of life)
    if not infra.PINNED_NODE.exists():
        pytest.skip("node_modules has no pinned node: run `npm ci` (make venv)")
    assert os.environ["JSII_NODE"] == str(infra.PINNED_NODE)
    version = subprocess.run([str(infra.PINNED_NODE), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"v{pinned}"


def make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", "-o", ".venv/.installed", *args], cwd=ROOT,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=60)


@needs_make
def test_preflight_runs_first_with_the_deploys_stack_region_and_model():
    run = make("-n", "deploy", *CONTEXT)
    assert run.returncode == 0, run.stderr
    preflight, deploy = run.stdout.strip().splitlines()
    assert preflight.split() == ["AWS_REGION=eu-west-1", ".venv/bin/review", "--stack", "ContractReviewEu", "preflight",
                                 "--before-deploy", "--model-id", "eu.anthropic.x", "--worker", "fargate"]
    assert deploy.split() == ["AWS_REGION=eu-west-1", "npx", "cdk", "deploy", "-c", "profile=prod", "-c",
                              "stack_name=ContractReviewEu", "-c", "alarm_email=oncall@example.com", "-c",
                              "model_id=eu.anthropic.x", "-c", "worker=fargate"]


def _stand_ins(bin_dir: Path, log: Path) -> None:
    bin_dir.mkdir()
    for name, code in (("review", '"${PREFLIGHT_EXIT:-0}"'), ("npx", "0")):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "{name} $AWS_REGION $*" >> "{log}"\nexit {code}\n')
        script.chmod(0o755)


@needs_make
@pytest.mark.parametrize("preflight_exit", [0, 1])
def test_preflights_exit_code_gates_the_deploy(tmp_path: Path, preflight_exit: int):
    log = tmp_path / "calls.log"
    _stand_ins(tmp_path / "bin", log)
    run = make("deploy", *CONTEXT, f"BIN={tmp_path / 'bin'}", env={"PREFLIGHT_EXIT": str(preflight_exit)})
    calls = log.read_text().splitlines()
    assert calls[0] == ("review eu-west-1 --stack ContractReviewEu preflight --before-deploy --model-id eu.anthropic.x "
                        "--worker fargate")
    if preflight_exit:
        assert run.returncode != 0 and calls == calls[:1]  # no deploy after a blocking failure
    else:
        assert run.returncode == 0, run.stderr
        assert calls[1:] == ["npx eu-west-1 cdk deploy -c profile=prod -c stack_name=ContractReviewEu "
                             "-c alarm_email=oncall@example.com -c model_id=eu.anthropic.x -c worker=fargate"]


def test_an_integration_files_tests_stay_on_one_xdist_worker(tmp_path: Path) -> None:
    """`make test` relies on `--dist loadgroup` keeping each integration file on one worker (its module-scoped stack
    built once). pytest 9.2's node ids broke xdist 3.8's grouping silently (an open pytest-xdist bug): every test went
    its own way and each worker built its own copy of every stack. Run the suite's own hook under `-n 2`."""
    suite = tmp_path / "tests"
    (suite / "integration").mkdir(parents=True)
    (suite / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                                       "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    for name in ("test_one", "test_two"):
        (suite / "integration" / f"{name}.py").write_text(
            "import os, pytest\n@pytest.mark.parametrize('i', range(6))\n"
            "def test_worker(i):\n    print(os.environ['PYTEST_XDIST_WORKER'])\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider",
                          "-p", "no:randomly", str(suite)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    workers: dict[str, set[str]] = {}
    for line in out.stdout.splitlines():
        if "PASSED" in line and "::test_worker" in line:
            worker, test = line.split()[0], line.split()[-1]
            assert test.endswith(f"@integration:{test.split('/')[-1].split('.py')[0]}"), test
            workers.setdefault(test.split("::")[0], set()).add(worker)
    assert len(workers) == 2 and all(len(w) == 1 for w in workers.values()), workers


# --- the install: uv from the pin in requirements.txt, pip when uv cannot ---------------------------------------

# A stand-in for the interpreter `make venv` runs (PY=...): `-m venv DIR` makes DIR/bin/python (this script again),
# DIR/bin/uv and DIR/bin/npm, each recording its arguments in $LOG and exiting as $FAIL_<WHAT> says.
FAKE_PY = r"""#!/bin/sh
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin"; cp "$0" "$3/bin/python"
  printf '#!/bin/sh\necho "uv $*" >> "$LOG"\n[ "$1" = --version ] && echo "uv 9.9.9"\n[ "$1 $2" = "pip install" ] && exit "${FAIL_UV_INSTALL:-0}"\nexit 0\n' > "$3/bin/uv"
  printf '#!/bin/sh\necho "npm $*" >> "$LOG"\n' > "$3/bin/npm"
  chmod +x "$3/bin/uv" "$3/bin/npm"; exit 0
fi
echo "python $*" >> "$LOG"
case "$*" in *"install --quiet --disable-pip-version-check uv=="*) exit "${FAIL_PIP_UV:-0}";; esac
exit 0
"""


def _install(tmp_path: Path, *make_args: str, **fail: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    fake = tmp_path / "fakepy"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    log = tmp_path / "calls.log"
    log.touch()
    run = subprocess.run(["make", "--no-print-directory", "venv", f"PY={fake}", f"VENV={tmp_path / 'venv'}",
                          *make_args], cwd=ROOT, env={**os.environ, "LOG": str(log), **fail},
                         capture_output=True, text=True, timeout=60)
    return run, log.read_text().splitlines()


def _pin(name: str) -> str:
    [line] = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith(f"{name}==")]
    return line.split()[0]


@needs_make
def test_make_venv_installs_the_requirements_with_the_pinned_uv(tmp_path: Path) -> None:
    run, calls = _install(tmp_path)
    assert run.returncode == 0, run.stderr
    venv = tmp_path / "venv"
    assert calls[0] == f"python -m pip install --quiet --disable-pip-version-check {_pin('uv')}"
    assert f"uv pip install --quiet --compile-bytecode --python {venv}/bin/python -r requirements.txt" in calls
    assert not [c for c in calls if "-r requirements.txt" in c and c.startswith("python")]  # pip installed only uv
    assert calls[-1] == "npm ci --silent --no-audit --no-fund" and (venv / ".installed").exists()
    assert "installed the requirements with uv 9.9.9" in run.stdout


@needs_make
@pytest.mark.parametrize("fail", [{"FAIL_PIP_UV": "1"}, {"FAIL_UV_INSTALL": "1"}], ids=["uv-not-installable",
                                                                                       "uv-install-fails"])
def test_make_venv_falls_back_to_pip_when_uv_cannot_install(tmp_path: Path, fail: dict[str, str]) -> None:
    run, calls = _install(tmp_path, **fail)
    assert run.returncode == 0, run.stderr
    assert "uv could not install the requirements: installing them with pip" in run.stdout
    assert calls[-3:] == ["python -m pip install --quiet --upgrade pip", "python -m pip install --quiet -r requirements.txt",
                          "npm ci --silent --no-audit --no-fund"]
    assert (tmp_path / "venv" / ".installed").exists()


@needs_make
def test_installer_pip_skips_uv_and_a_failing_pip_fails_the_install(tmp_path: Path) -> None:
    run, calls = _install(tmp_path, "INSTALLER=pip")
    assert run.returncode == 0, run.stderr
    assert not [c for c in calls if "uv" in c] and "installed the requirements with pip" in run.stdout
    # AND when the fallback fails too, make fails: no stamp, no npm
    failing = tmp_path / "again"
    failing.mkdir()
    fake = FAKE_PY.replace('echo "python $*" >> "$LOG"', 'echo "python $*" >> "$LOG"; exit 1')
    (failing / "fakepy").write_text(fake)
    (failing / "fakepy").chmod(0o755)
    run = subprocess.run(["make", "--no-print-directory", "venv", f"PY={failing / 'fakepy'}",
                          f"VENV={failing / 'venv'}"], cwd=ROOT, env={**os.environ, "LOG": str(failing / "log")},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and not (failing / "venv" / ".installed").exists()
    assert "npm" not in (failing / "log").read_text()
