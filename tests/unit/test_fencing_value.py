"""A fenced write is one value (crewwork/store/fencing/vocabulary.py): `FencedWrite` (who writes which item at which
rank) and `StateChange`, built once where a write starts and carried unchanged through the store's paths, its text
made storable when it is built. These tests hold the value to that, and keep the state change's parameters from
being spelled out again along the way (the issue counted three signatures of eleven keywords and two calls
forwarding them)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from crewwork.models import WorkItemState
from crewwork.store.fencing import AttemptRecord, FencedWrite, Rank, StateChange

PACKAGE = Path(__file__).resolve().parents[2] / "crewwork"

# What a state change is made of: its `FencedWrite` and its own fields.
PARTS = {f.name for f in dataclasses.fields(FencedWrite)} | {f.name for f in dataclasses.fields(StateChange)} - {
    "write"
}

# The one place allowed to spell them: where an attempt builds its change (the steps call it with what they change).
BUILDERS = {"crewwork/steps/attempt.py:AttemptWriter.set_state"}


def _spelled_out() -> tuple[list[str], list[str]]:
    """Functions taking five or more of a state change's parts as parameters, and calls passing five or more of them
    as keywords to anything but the values' own constructors."""
    signatures, calls = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE.parent))
        tree = ast.parse(path.read_text())
        for cls in [None, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]:
            body = tree.body if cls is None else cls.body
            for fn in (n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
                args = fn.args
                names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
                where = f"{rel}:{cls.name + '.' if cls else ''}{fn.name}"
                if len(names & PARTS) >= 5 and where not in BUILDERS:
                    signatures.append(where)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) not in ("StateChange", "FencedWrite"):
                if len({k.arg for k in node.keywords} & PARTS) >= 5:
                    calls.append(f"{rel}:{node.lineno}: {ast.unparse(node.func)}")
    return signatures, calls


def test_no_signature_or_call_spells_out_a_state_change() -> None:
    signatures, calls = _spelled_out()
    assert signatures == [], "take a StateChange (or a FencedWrite), do not spell its parts out"
    assert calls == [], "hand the StateChange on as it is"


def test_a_state_change_is_made_storable_once_when_it_is_built() -> None:
    """NUL and lone surrogates (which no store column keeps) are replaced when the value is built, so every path
    writes the same text; the value cannot be changed afterwards."""
    change = StateChange(
        FencedWrite("wi_1", "tn_1", Rank(2, 1), "run_agent#1\x00"),
        WorkItemState.failed,
        "it said \x00 and \ud800",
        fields={"result": {"claims\x00": ["\ud800"]}},
        event_data={"attempt": 1, "note": "a\x00b"},
        attempt=AttemptRecord(number=1, verdict="failed", reason="r\x00", agent={"out": "\udcff"}),
    )
    assert change.write.writer == "run_agent#1\ufffd"
    assert change.reason == "it said \ufffd and \ufffd"
    assert change.fields == {"result": {"claims\ufffd": ["\ufffd"]}}
    assert change.event_data == {"attempt": 1, "note": "a\ufffdb"}
    assert (
        change.attempt is not None and change.attempt.reason == "r\ufffd" and change.attempt.agent == {"out": "\ufffd"}
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        change.reason = "changed"  # type: ignore[misc]


def test_what_a_change_records_is_masked_and_its_row_keeps_what_it_was_given() -> None:
    """The `state_changed` event, the webhook payload and an attempt's evidence are masked when written (one method
    each, which both paths call); the item's own `reason` column keeps the text as it came, as it always has."""
    change = StateChange(
        FencedWrite("wi_1", "tn_1", Rank(3, 1), "finish#1"),
        WorkItemState.succeeded,
        "done with token=abcdef123456",
        fields={"delivery_branch": "crewwork/wi_1", "result": {"pull_request_url": "https://x/pull/1"}},
        event_data={"attempt": 2},
    )
    assert change.event() == {"state": "succeeded", "reason": "done with token=***", "writer": "finish#1", "attempt": 2}
    assert change.webhook_payload(occurred_at=5.0) == {
        "work_item_id": "wi_1",
        "state": "succeeded",
        "reason": "done with token=***",
        "occurred_at": 5.0,
        "delivery_branch": "crewwork/wi_1",
        "pull_request_url": "https://x/pull/1",
    }
    assert "occurred_at" not in change.webhook_payload()
    assert change.reason == "done with token=abcdef123456"
    record = AttemptRecord(number=1, verdict="failed", reason="r", validation={"log": "password: hunter22"})
    assert record.columns()["validation"] == {"log": "password: ***"}
    assert FencedWrite("wi_1", "tn_1", Rank(1, 1), "w").event({"x": "Bearer abcdefghijk"}) == {
        "x": "Bearer ***",
        "writer": "w",
    }


def test_hand_offs_are_asked_for_only_by_a_change_that_can_free_a_place() -> None:
    write = FencedWrite("wi_1", "tn_1", Rank(1, 1), "w")
    assert StateChange(write, WorkItemState.succeeded, max_in_flight=2, hand_off_cap=4).hands_off
    assert not StateChange(write, WorkItemState.succeeded, max_in_flight=None, hand_off_cap=4).hands_off
    assert not StateChange(write, WorkItemState.succeeded, max_in_flight=2, hand_off_cap=0).hands_off
    assert not StateChange(write, WorkItemState.running, max_in_flight=2, hand_off_cap=4).hands_off


if __name__ == "__main__":  # the figures: `python tests/unit/test_fencing_value.py`
    sigs, forwarded = _spelled_out()
    print(f"signatures spelling a state change out: {len(sigs)}", *sigs, sep="\n  ")
    print(f"calls forwarding its parts as keywords: {len(forwarded)}", *forwarded, sep="\n  ")
