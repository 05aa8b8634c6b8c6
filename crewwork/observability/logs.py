"""Structured logs: the work item id and workflow id on every line (JSON or plain text), secrets masked.

`configure_logging(json_logs=True)` installs `JsonFormatter` and `ContextFilter`; inside a Temporal activity the
workflow id comes from `activity.info()`, elsewhere from `log_context(work_item_id=..., workflow_id=...)`.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Iterator
from typing import Any

from crewwork.boundary.masking import mask_text

# ------------------------------------------------------------------------------------------------ logging

_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("crewwork_log_context", default=None)


@contextlib.contextmanager
def log_context(**fields: str | None) -> Iterator[None]:
    """Attach fields (e.g. work_item_id, workflow_id) to every log line written inside this block."""
    merged = {**(_context.get() or {}), **{k: v for k, v in fields.items() if v}}
    tok = _context.set(merged)
    try:
        yield
    finally:
        _context.reset(tok)


def work_item_id_from_workflow_id(workflow_id: str) -> str | None:
    prefix = "work-item-"
    return workflow_id[len(prefix) :] if workflow_id.startswith(prefix) else None


class ContextFilter(logging.Filter):
    """Adds `work_item_id` and `workflow_id` to every record (None outside any work item)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = dict(_context.get() or {})
        if "workflow_id" not in ctx:
            with contextlib.suppress(Exception):
                from temporalio import activity

                info = activity.info()
                ctx["workflow_id"] = info.workflow_id or ""
                ctx.setdefault("activity", info.activity_type)
        if "workflow_id" not in ctx:
            with contextlib.suppress(Exception):
                from temporalio import workflow

                ctx["workflow_id"] = workflow.info().workflow_id
        if "work_item_id" not in ctx and ctx.get("workflow_id"):
            wi = work_item_id_from_workflow_id(ctx["workflow_id"])
            if wi:
                ctx["work_item_id"] = wi
        for key in ("work_item_id", "workflow_id"):
            if not hasattr(record, key):
                setattr(record, key, ctx.get(key))
        if "activity" in ctx and not hasattr(record, "activity"):
            record.activity = ctx["activity"]
        return True


# Secrets never reach a log line: masked in the message, the exception text and every extra field, by the one table
# of secret shapes (crewwork/boundary/masking.py: URL passwords in place, PEM private keys, bearer and header values,
# token prefixes).


def _trace_fields(out: dict[str, Any]) -> None:
    from crewwork.observability import tracing

    ids = tracing.current_ids()
    if ids is not None:
        out["trace_id"], out["span_id"] = ids


class JsonFormatter(logging.Formatter):
    """One JSON object per line (json.dumps): ts, level, logger, msg, work_item_id, workflow_id, trace_id and span_id
    (when tracing is on), any `extra` fields, and `exc` with the traceback. Secrets are masked in every string."""

    _std = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": mask_text(record.getMessage()),
            "work_item_id": getattr(record, "work_item_id", None),
            "workflow_id": getattr(record, "workflow_id", None),
        }
        _trace_fields(out)
        for k, v in record.__dict__.items():
            if k not in self._std and k not in out:
                value = v if isinstance(v, str | int | float | bool | type(None)) else repr(v)
                out[k] = mask_text(value) if isinstance(value, str) else value
        if record.exc_info:
            out["exc"] = mask_text(self.formatException(record.exc_info))
        elif record.exc_text:
            out["exc"] = mask_text(record.exc_text)
        if record.stack_info:
            out["stack"] = mask_text(self.formatStack(record.stack_info))
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """One plain line per record (`TIME LEVEL LOGGER [work item] message`), the traceback on the lines after it;
    secrets masked."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(ctx)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        ctx = ""
        wi = getattr(record, "work_item_id", None)
        if wi:
            ctx += f" [{wi}]"
        ids: dict[str, Any] = {}
        _trace_fields(ids)
        if ids:
            ctx += f" trace={ids['trace_id']}"
        record.ctx = ctx
        return mask_text(super().format(record))


UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


def configure_logging(level: str = "INFO", *, json_logs: bool = True) -> None:
    """Route the root logger to stderr, as JSON lines (`json_logs`) or plain lines, with the work item context.

    uvicorn's own loggers are emptied and made to propagate, so their lines go through the same formatter (start
    uvicorn with `log_config=None`, or it installs its own handlers again)."""
    import sys

    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if json_logs else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        if json_logs or getattr(h, "_crewwork", False):
            root.removeHandler(h)  # JSON replaces every handler, so each line is emitted once, as JSON
    handler._crewwork = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in UVICORN_LOGGERS:
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            lg.removeHandler(h)
        lg.propagate = True
