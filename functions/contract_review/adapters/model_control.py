"""`ModelControls` (domain/ports.py) on an SSM parameter, read through Powertools Parameters (cached `max_age_s`):
the operator's runtime control of the model (`review quota pause|resume|set`), one JSON `ModelControl`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.utilities.parameters import SSMProvider
from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError

from contract_review.domain.records import ModelControl


class SsmModelControl:
    def __init__(self, client: Any, name: str, max_age_s: float):
        self.client, self.name, self.max_age_s = client, name, max_age_s
        self.provider = SSMProvider(boto3_client=client)

    def get(self) -> ModelControl:
        """The control as last read (at most `max_age_s` old). A parameter that is missing or unreadable is no
        control at all: the model runs as deployed (a broken control must not stop the pipeline)."""
        try:
            raw = self.provider.get(self.name, max_age=int(self.max_age_s) or 1)
        except GetParameterError:
            return ModelControl()
        return ModelControl.model_validate_json(str(raw)) if raw else ModelControl()

    def update(self, change: Callable[[ModelControl], ModelControl]) -> ModelControl:
        """Interim: a read-modify-write of one SSM parameter (SSM has no compare-and-set; issue 25 moves the control
        to a DynamoDB item with a version condition)."""
        try:
            raw = self.client.get_parameter(Name=self.name)["Parameter"]["Value"]
            current = ModelControl.model_validate_json(raw) if raw else ModelControl()
        except self.client.exceptions.ParameterNotFound:
            current = ModelControl()
        written = change(current).model_copy(update={"version": current.version + 1})
        self.client.put_parameter(Name=self.name, Value=json.dumps(written.model_dump(mode="json")), Type="String",
                                  Overwrite=True)
        self.provider.clear_cache()
        return written
