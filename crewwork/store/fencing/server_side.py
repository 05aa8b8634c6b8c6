"""PostgreSQL: a whole fenced write in one call of `crewwork_fenced_write` (migration 0008), outside an explicit
transaction: one round trip where the Python path makes 4 to 9 (BEGIN, the row's lock, each change, COMMIT), each
~0.3 ms of a worker's CPU. The function runs the Python path's statements in the same order, each with its own
snapshot; the Python path (reference.py) stays the reference, and tests/store/test_fencing_differential.py proves the
two agree. A write the function cannot express (more than one artifact, a column it does not set) runs the Python
path. The values a write is made of arrive as they were built; what it records of them is what their own methods
say (`StateChange.event`, `StateChange.webhook_payload`, `AttemptRecord.columns`, `FencedWrite.event`), as on the
Python path."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from asyncpg.exceptions import UndefinedFunctionError  # type: ignore[import-untyped]
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncSession

from crewwork.boundary.masking import mask_secrets
from crewwork.observability import tracing
from crewwork.store.engine import older_schema
from crewwork.store.fencing import sql
from crewwork.store.fencing.dialects import PostgresWrites
from crewwork.store.fencing.vocabulary import (
    IN_FLIGHT_STATES,
    TERMINAL_STATES,
    Admission,
    AttemptRecord,
    FencedWrite,
    HandedOff,
    Rank,
    StateChange,
    WriteResult,
)
from crewwork.store.views import NewArtifact

_NO_ARTIFACT: dict[str, Any] = {
    "art_id": None,
    "art_name": None,
    "art_type": None,
    "art_size": None,
    "art_sha": None,
    "art": None,
}


def json_text(value: Any) -> str:
    """A JSON value of a server-side write's operation, as the text the Python path's `json` columns store (what
    SQLAlchemy's JSON type binds: `json.dumps`). Passed inside `p_ops` as a string and cast to `json` there, it is
    stored as that text: `jsonb` would have rewritten it (its keys sorted, 1e16 made the integer 10000000000000000,
    1e300 an integer that is not 1e300, -0.0 made 0.0) and refused a lone surrogate."""
    return json.dumps(value)


def attempt_op(r: AttemptRecord, *, count: bool) -> dict[str, Any]:
    """The record as an 'attempt' operation of `crewwork_fenced_write`."""
    columns = r.columns()
    return {
        "op": "attempt",
        "number": r.number,
        **columns,
        # None is bound to the json column as the JSON value null on the Python path (`write_attempt`): alike.
        "agent": json_text(columns["agent"]),
        "validation": json_text(columns["validation"]),
        "event": json_text(r.event_data()),
        "count": count,
    }


class ServerWrites(PostgresWrites):
    """The fenced writes as calls of `crewwork_fenced_write`."""

    async def server_write(
        self,
        write: FencedWrite,
        ops: list[dict[str, Any]],
        *,
        hand_off: dict[str, int] | None = None,
        artifact: NewArtifact | None = None,
    ) -> WriteResult[dict[str, Any]]:
        """`fenced_write` with its operations (`ops`, see migration 0008) run by `crewwork_fenced_write` in one
        round trip. The accepted write's value holds what the operations yield ('fingerprints', 'admission',
        'handed')."""
        params: dict[str, Any] = {
            "wid": write.work_item_id,
            "tenant": write.tenant_id,
            "rank": write.rank.encode(),
            "writer": write.writer,
            "ops": json.dumps(ops),
            "terminal": TERMINAL_STATES,
            "in_flight": list(IN_FLIGHT_STATES),
            "hand_off": json.dumps(hand_off) if hand_off is not None else None,
            "trace": tracing.current_traceparent(),
            **_NO_ARTIFACT,
        }
        if artifact is not None:
            params.update(
                art_id=artifact.id,
                art_name=artifact.name,
                art_type=artifact.content_type,
                art_size=artifact.size,
                art_sha=artifact.sha256,
                art=artifact.content,
            )
        try:
            if self.db.driver_writes:
                raw = await self.db.driver_scalar(sql.SERVER_WRITE_DRIVER, *(params[k] for k in sql.SERVER_WRITE_ARGS))
            else:
                raw = await self.db.autocommit_scalar(sql.SERVER_WRITE, params)
        except (ProgrammingError, UndefinedFunctionError) as exc:
            older = older_schema(exc, "crewwork_fenced_write", "0008")
            if older is not None:
                raise older from exc
            raise
        out = json.loads(raw) if isinstance(raw, str) else raw
        if out.get("missing"):
            return WriteResult(ok=False, missing=True)
        current = Rank.decode(int(out["mark"]))
        if not out["ok"]:
            return WriteResult(ok=False, current=current, closed=bool(out.get("closed")), state=out["state"])
        return WriteResult(ok=True, value=out["results"], current=current, state=out["state"])

    async def fenced_event(
        self, write: FencedWrite, type_: str, data: dict[str, Any], artifacts: Sequence[NewArtifact] = ()
    ) -> WriteResult[None]:
        if len(artifacts) > 1:
            return await super().fenced_event(write, type_, data, artifacts)
        ops: list[dict[str, Any]] = [{"op": "artifact"}] if artifacts else []
        ops.append({"op": "event", "type": type_, "data": json_text(write.event(data))})
        res = await self.server_write(write, ops, artifact=artifacts[0] if artifacts else None)
        return res.carrying(None)

    async def set_state(self, change: StateChange) -> WriteResult[list[HandedOff]]:
        if set(change.fields or ()) - sql.SERVER_FIELDS:
            return await super().set_state(change)
        attempt = change.attempt
        ops: list[dict[str, Any]] = [attempt_op(attempt, count=False)] if attempt is not None else []
        server_fields: dict[str, Any] = dict(change.fields or {})
        if "result" in server_fields:
            server_fields["result"] = json_text(server_fields["result"])
        if attempt is not None:
            server_fields["attempt_count_at_least"] = attempt.number
        ops.append(
            {
                "op": "state",
                "state": change.state.value,
                "reason": change.reason,
                "fields": server_fields,
                "event": json_text(change.event()),
                "payload": change.webhook_payload(),
            }
        )
        hand_off = None
        if change.hands_off and change.max_in_flight is not None:
            hand_off = {"max": change.max_in_flight, "cap": change.hand_off_cap}
        res = await self.server_write(change.write, ops, hand_off=hand_off)
        handed = [HandedOff(**h) for h in (res.value or {}).get("handed", [])] if res.ok else None
        return res.carrying(handed)

    async def admit(
        self,
        write: FencedWrite,
        max_in_flight: int | None,
        fingerprints: Callable[[AsyncSession, str], Awaitable[list[str | None]]],
    ) -> WriteResult[Admission]:
        # The writer as the state change's event names it (masked, as `StateChange.event` masks it).
        res = await self.server_write(
            write, [{"op": "admit", "max": max_in_flight, "writer": mask_secrets(write.writer)}]
        )
        adm = (res.value or {}).get("admission")
        return res.carrying(
            None
            if adm is None
            else Admission(
                admitted=bool(adm["admitted"]),
                queued_position=adm.get("queued_position"),
                in_flight=int(adm.get("in_flight") or 0),
                fingerprints=list(adm.get("fingerprints") or []),
            )
        )

    async def record_attempt(self, write: FencedWrite, record: AttemptRecord) -> WriteResult[list[str | None]]:
        res = await self.server_write(write, [attempt_op(record, count=True), {"op": "fingerprints"}])
        return res.carrying(list((res.value or {}).get("fingerprints", [])) if res.ok else None)
