"""crewwork's data converter (crewwork/temporal/client.py) encodes and decodes exactly as temporalio's pydantic data
converter does, while every payload converter the SDK constructs shares the first one's encoding converters."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import WorkflowSerializationContext

from crewwork.models import WorkItemSpec, WorkItemState, WorkItemStatus
from crewwork.temporal.client import DATA_CONVERTER, SharedPydanticPayloadConverter

SPEC = WorkItemSpec.model_validate(
    {"kind": "task", "input": {"n": 1e16, "z": -0.0, "s": "é\u2028"}, "agent": {"name": "scripted", "config": {}}}
)
VALUES: list[Any] = [
    SPEC,
    WorkItemStatus(work_item_id="wi_1", state=WorkItemState.running, attempt=1, max_attempts=3),
    {"a": [1, 2.5, None, True]},
    "text",
    None,
    b"\x00\xff",
    datetime(2026, 12, 8, tzinfo=UTC),
]


async def test_the_same_payloads_as_the_sdks_pydantic_converter() -> None:
    ours = await DATA_CONVERTER.encode(VALUES)
    theirs = await pydantic_data_converter.encode(VALUES)
    assert ours == theirs
    types = [type(v) for v in VALUES]
    assert await DATA_CONVERTER.decode(ours, types) == await pydantic_data_converter.decode(theirs, types)


def test_every_construction_shares_the_first_ones_converters() -> None:
    first, second = SharedPydanticPayloadConverter(), SharedPydanticPayloadConverter()
    assert first.converters is second.converters
    ctx = WorkflowSerializationContext(namespace="default", workflow_id="work-item-wi_1")
    # What the SDK does per activation and per context: a new data converter, and the context's converter.
    clone = DATA_CONVERTER.with_context(ctx)
    assert clone.payload_converter.to_payloads([SPEC]) == DATA_CONVERTER.payload_converter.to_payloads([SPEC])


@pytest.mark.parametrize("value", VALUES[:4])
def test_a_value_round_trips(value: Any) -> None:
    conv = DATA_CONVERTER.payload_converter
    assert conv.from_payloads(conv.to_payloads([value]), [type(value)]) == [value]
