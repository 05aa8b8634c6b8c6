"""Observability: Prometheus metrics (text exposition format, written here: no extra dependency) and structured JSON
logs carrying the work item id and workflow id on every line.

- `REGISTRY` holds this process's counters, gauges and histograms; `render()` writes the text format.
- Collectors (`REGISTRY.add_collector`) compute gauges at scrape time, e.g. work items by state from the store: the
  store's rows and its append-only event log are the source of truth, metrics are projections of them.
- `serve_metrics(port)` exposes `/metrics` from a worker pool process (`CREWWORK_METRICS_PORT`).
- `configure_logging(json=True)` installs `JsonFormatter` and `ContextFilter`; inside a Temporal activity the
  workflow id comes from `activity.info()`, elsewhere from `log_context(work_item_id=..., workflow_id=...)`.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import contextvars
import json
import logging
import math
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

# ------------------------------------------------------------------------------------------------ metrics

DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

LabelValues = tuple[str, ...]


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(str(v))}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _num(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help_: str, labels: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_
        self.label_names = tuple(labels)
        self._lock = threading.Lock()

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    def samples(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help_: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help_, labels)
        self._values: dict[LabelValues, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(str(labels[n]) for n in self.label_names)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        return self._values.get(tuple(str(labels[n]) for n in self.label_names), 0.0)

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.label_names, k)} {_num(v)}" for k, v in items]


class Gauge(_Metric):
    kind = "gauge"

    def __init__(self, name: str, help_: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help_, labels)
        self._values: dict[LabelValues, float] = {}

    def set(self, value: float, **labels: str) -> None:
        key = tuple(str(labels[n]) for n in self.label_names)
        with self._lock:
            self._values[key] = value

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(str(labels[n]) for n in self.label_names)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self.inc(-amount, **labels)

    def replace(self, values: dict[LabelValues, float]) -> None:
        """Set the whole family at once (label sets not given disappear), for scrape-time projections."""
        with self._lock:
            self._values = dict(values)

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.label_names, k)} {_num(v)}" for k, v in items]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(
        self, name: str, help_: str, labels: Sequence[str] = (), buckets: Sequence[float] = DEFAULT_BUCKETS
    ) -> None:
        super().__init__(name, help_, labels)
        self.buckets = tuple(sorted(buckets))
        self._counts: dict[LabelValues, list[int]] = {}
        self._sums: dict[LabelValues, float] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(str(labels[n]) for n in self.label_names)
        i = bisect.bisect_left(self.buckets, value)
        with self._lock:
            counts = self._counts.setdefault(key, [0] * (len(self.buckets) + 1))
            counts[i] += 1
            self._sums[key] = self._sums.get(key, 0.0) + value

    @contextlib.contextmanager
    def time(self, **labels: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.observe(time.perf_counter() - t0, **labels)

    def samples(self) -> list[str]:
        out = []
        with self._lock:
            items = sorted((k, list(v), self._sums[k]) for k, v in self._counts.items())
        for key, counts, total in items:
            acc = 0
            for bound, c in zip((*self.buckets, math.inf), counts, strict=True):
                acc += c
                le = 'le="' + _num(bound) + '"'
                out.append(f"{self.name}_bucket{_labels(self.label_names, key, le)} {acc}")
            out.append(f"{self.name}_sum{_labels(self.label_names, key)} {_num(total)}")
            out.append(f"{self.name}_count{_labels(self.label_names, key)} {acc}")
        return out


Collector = Callable[[], Awaitable[None]]


class Registry:
    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._collectors: list[Collector] = []

    def register(self, metric: _Metric) -> Any:
        existing = self._metrics.get(metric.name)
        if existing is not None:
            return existing
        self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help_: str, labels: Sequence[str] = ()) -> Counter:
        return self.register(Counter(name, help_, labels))  # type: ignore[no-any-return]

    def gauge(self, name: str, help_: str, labels: Sequence[str] = ()) -> Gauge:
        return self.register(Gauge(name, help_, labels))  # type: ignore[no-any-return]

    def histogram(
        self, name: str, help_: str, labels: Sequence[str] = (), buckets: Sequence[float] = DEFAULT_BUCKETS
    ) -> Histogram:
        return self.register(Histogram(name, help_, labels, buckets))  # type: ignore[no-any-return]

    def add_collector(self, fn: Collector) -> None:
        self._collectors.append(fn)

    def remove_collector(self, fn: Collector) -> None:
        with contextlib.suppress(ValueError):
            self._collectors.remove(fn)

    async def collect(self) -> None:
        for fn in list(self._collectors):
            try:
                await fn()
            except Exception as exc:  # a failing projection must not break the scrape
                logging.getLogger("crewwork.metrics").warning("metrics collector failed: %s", exc)

    def render(self) -> str:
        lines: list[str] = []
        for m in self._metrics.values():
            lines += m.header()
            lines += m.samples()
        return "\n".join(lines) + "\n"


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

REGISTRY = Registry()

# Process-level metrics (each process counts its own; Prometheus sums across processes).
HTTP_REQUESTS = REGISTRY.counter(
    "crewwork_http_requests_total", "HTTP requests served by the API.", ("method", "route", "status")
)
HTTP_LATENCY = REGISTRY.histogram(
    "crewwork_http_request_duration_seconds", "HTTP request latency of the API.", ("method", "route")
)
RATE_LIMITED = REGISTRY.counter("crewwork_rate_limited_total", "Requests refused with 429 by the per-key limiter.")
SSE_CLIENTS = REGISTRY.gauge("crewwork_sse_clients", "Open Server-Sent Events streams.")
WEBHOOK_DELIVERIES = REGISTRY.counter(
    "crewwork_webhook_deliveries_total", "Webhook delivery attempts by this process, by result.", ("result",)
)

# Projections of the store, filled at scrape time by `store_collector`.
WORK_ITEMS = REGISTRY.gauge("crewwork_work_items", "Work items by state and kind.", ("state", "kind"))
ATTEMPTS = REGISTRY.gauge("crewwork_attempts", "Recorded attempts by verdict and cause.", ("verdict", "cause"))
EVENTS_BY_TYPE = REGISTRY.gauge(
    "crewwork_events",
    "Events in the append-only log by type (stale_write_rejected counts rejected fenced writes).",
    ("type",),
)
SANDBOX_CAPS = REGISTRY.gauge(
    "crewwork_sandbox_cap_hits", "Attempts whose validation hit a sandbox cap, by cause.", ("cause",)
)
MODEL_TOKENS = REGISTRY.gauge("crewwork_model_tokens", "Model tokens used across recorded attempts.")
OUTBOX = REGISTRY.gauge("crewwork_outbox_messages", "Webhook outbox rows by status.", ("status",))

SANDBOX_CAP_CAUSES = ("timeout", "oom", "pids")


def store_collector(store: Any) -> Collector:
    """A scrape-time projection of the store into the gauges above (`Store.store_counts`: aggregate queries)."""

    async def collect() -> None:
        counts = await store.store_counts()
        WORK_ITEMS.replace({k: float(v) for k, v in counts.work_items.items()})
        ATTEMPTS.replace({k: float(v) for k, v in counts.attempts.items()})
        SANDBOX_CAPS.replace(
            {
                (cause,): float(sum(n for (_v, c), n in counts.attempts.items() if c == cause))
                for cause in SANDBOX_CAP_CAUSES
            }
        )
        EVENTS_BY_TYPE.replace({(k,): float(v) for k, v in counts.events.items()})
        OUTBOX.replace({(k,): float(v) for k, v in counts.outbox.items()})
        MODEL_TOKENS.set(float(counts.model_tokens))

    return collect


async def serve_metrics(port: int, host: str = "0.0.0.0", registry: Registry = REGISTRY) -> asyncio.AbstractServer:
    """A minimal HTTP server answering `GET /metrics` (for worker pool processes, which have no web framework)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            parts = request_line.decode("latin-1").split()
            if len(parts) >= 2 and parts[0] == "GET" and parts[1].split("?")[0] == "/metrics":
                await registry.collect()
                body = registry.render().encode()
                head = f"HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\n"
            else:
                body = b"not found\n"
                head = "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
            writer.write(f"{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)


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


# Secrets never reach a log line: masked in the message, the exception text and every extra field.
_URL_WITH_PASSWORD = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]+:[^\s@/]*@[^\s'\"]*")
_PEM_PRIVATE_KEY = re.compile(
    r"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|\Z)", re.S
)
_LOG_TOKENS = [
    re.compile(r"\bcw_[A-Za-z0-9_-]{8,}"),  # crewwork API keys
    re.compile(r"\bwhsec_[A-Za-z0-9+/=_-]{8,}"),  # webhook secrets
]


def _mask_url(m: re.Match[str]) -> str:
    from sqlalchemy.engine import make_url

    text = m.group(0)
    try:
        # SQLAlchemy's own rendering of a URL with the password hidden (also right for quoted/odd passwords).
        return make_url(text).render_as_string(hide_password=True)
    except Exception:
        return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", text)


def mask_secrets_in_text(text: str) -> str:
    """Mask database/URL passwords (SQLAlchemy's rendering with the password hidden), PEM private keys, bearer
    tokens and common token prefixes (`sk-`, `cw_`, `ghp_`, `whsec_`, ... see crewwork.transport.redact)."""
    if not text:
        return text
    from crewwork.transport.redact import MASK, redact

    text = _PEM_PRIVATE_KEY.sub(lambda m: f"-----BEGIN {m.group(1)}PRIVATE KEY-----{MASK}", text)
    text = _URL_WITH_PASSWORD.sub(_mask_url, text)
    for pattern in _LOG_TOKENS:
        text = pattern.sub(MASK, text)
    return redact(text)


def _trace_fields(out: dict[str, Any]) -> None:
    from crewwork import tracing

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
            "msg": mask_secrets_in_text(record.getMessage()),
            "work_item_id": getattr(record, "work_item_id", None),
            "workflow_id": getattr(record, "workflow_id", None),
        }
        _trace_fields(out)
        for k, v in record.__dict__.items():
            if k not in self._std and k not in out:
                value = v if isinstance(v, str | int | float | bool | type(None)) else repr(v)
                out[k] = mask_secrets_in_text(value) if isinstance(value, str) else value
        if record.exc_info:
            out["exc"] = mask_secrets_in_text(self.formatException(record.exc_info))
        elif record.exc_text:
            out["exc"] = mask_secrets_in_text(record.exc_text)
        if record.stack_info:
            out["stack"] = mask_secrets_in_text(self.formatStack(record.stack_info))
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
        return mask_secrets_in_text(super().format(record))


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


# ------------------------------------------------------------------------------------------------ worker pools

ACTIVITY_SECONDS = REGISTRY.histogram(
    "crewwork_activity_duration_seconds",
    "Wall time of activity executions in this pool process, by activity type and outcome.",
    ("activity", "outcome"),
)
POOL_INFO = REGISTRY.gauge("crewwork_pool_info", "The pool this process runs (value 1).", ("pool", "task_queue"))


_activity_log = logging.getLogger("crewwork.activity")


def activity_interceptors() -> list[Any]:
    """Temporal worker interceptors that time every activity into ACTIVITY_SECONDS and put the work item and
    workflow id into the logging context for its duration."""
    from temporalio import activity
    from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

    class _Inbound(ActivityInboundInterceptor):
        async def execute_activity(self, input: ExecuteActivityInput) -> Any:
            info = activity.info()
            t0 = time.perf_counter()
            outcome = "error"
            with log_context(
                workflow_id=info.workflow_id,
                work_item_id=work_item_id_from_workflow_id(info.workflow_id or ""),
                activity=info.activity_type,
            ):
                try:
                    result = await super().execute_activity(input)
                    outcome = "ok"
                    return result
                finally:
                    took = time.perf_counter() - t0
                    ACTIVITY_SECONDS.observe(took, activity=info.activity_type, outcome=outcome)
                    _activity_log.debug(
                        "activity %s %s in %.3fs (attempt %s)",
                        info.activity_type,
                        outcome,
                        took,
                        info.attempt,
                        extra={"duration_s": round(took, 6), "outcome": outcome},
                    )

    class _Interceptor(Interceptor):
        def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
            return _Inbound(next)

    return [_Interceptor()]


def enable_temporal_runtime_metrics(port: int, host: str = "0.0.0.0") -> None:
    """Make the Temporal SDK's own metrics (workflow/activity task latencies, pollers, slots, sticky cache...)
    available in Prometheus format on host:port. Must run before the first Client.connect of the process."""
    from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

    Runtime.set_default(
        Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"{host}:{port}"))),
        error_if_already_set=False,
    )


async def start_pool_observability(pool: str, task_queue: str, store: Any = None) -> asyncio.AbstractServer | None:
    """Called by a pool process at start. Environment:

    - CREWWORK_LOG_FORMAT=json: JSON log lines with work_item_id/workflow_id (default: plain text; set up by
      `crewwork worker` before this runs, from Settings.log_format);
    - CREWWORK_METRICS_PORT=N: crewwork metrics of this process at http://0.0.0.0:N/metrics (the control pool also
      serves the store projections);
    - CREWWORK_TEMPORAL_METRICS_PORT=N: the Temporal SDK runtime metrics on port N (must differ from the above)."""
    from crewwork.config import get_settings

    settings = get_settings()
    if settings.temporal_metrics_port:
        enable_temporal_runtime_metrics(settings.temporal_metrics_port)
    POOL_INFO.set(1, pool=pool, task_queue=task_queue)
    port = settings.metrics_port
    if not port:
        return None
    if pool == "control" and store is not None:
        REGISTRY.add_collector(store_collector(store))
    return await serve_metrics(int(port))
