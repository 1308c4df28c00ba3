"""The AWS SDK the code was tested with, as the functions' SDK layer carries it and `review preflight` checks it.

The Lambda Python runtime brings its own boto3 and botocore, unpinned and older than requirements.txt pins (batch
inference's `modelInvocationType` and Converse's `cachePoint` need a recent botocore). The stack ships the pinned
ones in a layer of its own (infra/sdk_layer.py), built from the distributions installed in the venv the tests ran
in: boto3 and everything it needs, all pure Python (`SDK_DISTRIBUTIONS`; a test keeps the list closed under their
requirements). The layer version's description names each `name==version` (`sdk_description`), so preflight can
read what a deployed stack's functions import (`parse_sdk_description`) and compare it with this checkout's
(`installed_sdk`). Nothing here imports boto3: the versions come from the installed distributions' metadata.
"""

from __future__ import annotations

from importlib.metadata import version

# boto3 and its requirements' closure (extras such as botocore[crt] left out: not installed, not shipped)
SDK_DISTRIBUTIONS = ("boto3", "botocore", "s3transfer", "jmespath", "urllib3", "python-dateutil", "six")
SDK_DESCRIPTION_PREFIX = "contract-review SDK:"


def installed_sdk() -> dict[str, str]:
    """Each SDK distribution's version as installed here (the venv of `make venv`: requirements.txt's pins)."""
    return {name: version(name) for name in SDK_DISTRIBUTIONS}


def sdk_description(versions: dict[str, str]) -> str:
    """The layer version's description: `contract-review SDK: boto3==1.44.5 botocore==1.44.8 ...` (Lambda allows 256
    characters)."""
    return " ".join([SDK_DESCRIPTION_PREFIX, *(f"{name}=={versions[name]}" for name in SDK_DISTRIBUTIONS)])


def parse_sdk_description(description: str) -> dict[str, str] | None:
    """The versions a layer's description names; None for a description `sdk_description` did not write."""
    if not description.startswith(SDK_DESCRIPTION_PREFIX):
        return None
    pairs = [token.split("==", 1) for token in description[len(SDK_DESCRIPTION_PREFIX):].split()]
    return {pair[0]: pair[1] for pair in pairs if len(pair) == 2}
