"""OpenTelemetry tracing, off unless configured.

Tracing is on when the standard variables ask for it, read the way the OpenTelemetry SDK reads them:
`OTEL_TRACES_EXPORTER` names one or more exporters (`otlp`, `console`, ...; `none` turns tracing off), or, without
it, `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (then `otlp`). `OTEL_SDK_DISABLED=true`
wins over both. The SDK itself reads everything else (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
`OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`, the exporters' `OTEL_EXPORTER_OTLP_*`). The exporters come from the SDK's
`opentelemetry_traces_exporter` entry points, so whatever exporter package is installed works by its name; the
`otel` extra installs the SDK, the instrumentations and the OTLP exporter.

What is traced, in one trace per submission:

- the API's requests (opentelemetry-instrumentation-fastapi, server spans);
- the Temporal client and the workers, through `temporalio.contrib.opentelemetry.TracingInterceptor` on the client
  (workers built from that client inherit it), so `StartWorkflow` is a child of the API request and the workflow
  run and every activity continue that trace;
- outgoing httpx calls (the model transport, webhook deliveries) through the instrumentation's transport wrapper,
  which also sends `traceparent` to the callee;
- webhook deliveries: the outbox row keeps the `traceparent` of the change that wrote it, so a delivery made later
  by another process still joins the work item's trace;
- the trace and span ids in every JSON log line (`crewwork.observability.JsonFormatter`).

Nothing here imports OpenTelemetry unless tracing is on, so a deployment without the extra pays nothing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

    from crewwork.config import Settings

log = logging.getLogger("crewwork.observability.tracing")

INSTRUMENTATION_NAME = "crewwork"
INSTALL_HINT = "pip install 'crewwork[otel]'"


class TracingConfigError(RuntimeError):
    """The OTEL_* variables ask for something that is not installed or does not exist."""


@dataclass
class _Tracing:
    provider: Any
    """An `opentelemetry.sdk.trace.TracerProvider` (or any API TracerProvider)."""
    owned: bool
    """True when this module built the provider (and so flushes and shuts it down)."""

    def tracer(self) -> Any:
        return self.provider.get_tracer(INSTRUMENTATION_NAME)


_state: _Tracing | None = None


def enabled() -> bool:
    return _state is not None


def exporter_names(settings: Settings) -> list[str]:
    """The exporters the OTEL_* variables ask for; empty means tracing is off."""
    if settings.otel_sdk_disabled:
        return []
    if settings.otel_traces_exporter is not None:
        names = [n.strip() for n in settings.otel_traces_exporter.split(",") if n.strip()]
        return [] if names in ([], ["none"]) else [n for n in names if n != "none"]
    if settings.otel_exporter_otlp_endpoint or settings.otel_exporter_otlp_traces_endpoint:
        return ["otlp"]
    return []


def configure(settings: Settings, service_name: str) -> bool:
    """Turn tracing on for this process if the OTEL_* variables ask for it. Returns whether it is on.

    Raises TracingConfigError, naming what to install, when an asked-for exporter is missing: an operator who asked
    for traces learns at start-up, not by finding none."""
    global _state
    if _state is not None:
        return True
    names = exporter_names(settings)
    if not names:
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingConfigError(
            f"OTEL_TRACES_EXPORTER/OTEL_EXPORTER_OTLP_ENDPOINT ask for traces but the OpenTelemetry SDK is not "
            f"installed ({exc.name}); {INSTALL_HINT}"
        ) from exc
    _check_instrumentations()
    exporters = [_load_exporter(n) for n in names]
    # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES (read by Resource.create) win over this process's default name.
    attrs = {} if settings.otel_service_name else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(attrs))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _state = _Tracing(provider, owned=True)
    log.info("tracing on: exporters %s, service %s", ",".join(names), settings.otel_service_name or service_name)
    return True


def use_provider(provider: Any) -> None:
    """Trace with this provider (tests with an in-memory exporter, or an application embedding crewwork that set
    up OpenTelemetry itself). The provider is not made the global one."""
    global _state
    _check_instrumentations()
    _state = _Tracing(provider, owned=False)


def disable() -> None:
    """Turn tracing off again (tests)."""
    global _state
    _state = None


def shutdown() -> None:
    """Flush and stop the exporters of a provider this module built (at process exit)."""
    if _state is not None and _state.owned:
        with contextlib.suppress(Exception):
            _state.provider.shutdown()


def _check_instrumentations() -> None:
    missing = []
    for module in ("opentelemetry.instrumentation.fastapi", "opentelemetry.instrumentation.httpx"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise TracingConfigError(f"tracing needs {', '.join(missing)}; {INSTALL_HINT}")


def _load_exporter(name: str) -> Any:
    from importlib.metadata import entry_points

    found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
    if not found:
        known = sorted({ep.name for ep in entry_points(group="opentelemetry_traces_exporter")})
        raise TracingConfigError(
            f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package provides (installed: "
            f"{', '.join(known) or 'none'}); {INSTALL_HINT} brings `otlp`"
        )
    try:
        return found[0].load()()
    except Exception as exc:
        raise TracingConfigError(f"trace exporter {name!r} could not be created: {exc}") from exc


# ------------------------------------------------------------------------------------------------ hook points


def client_interceptors() -> list[Any]:
    """Interceptors for `Client.connect`: the SDK's tracing interceptor when tracing is on. Workers built from the
    client inherit it, so workflow runs and activities continue the trace of whoever started them."""
    if _state is None:
        return []
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return [TracingInterceptor(_state.tracer())]


def instrument_app(app: Any) -> None:
    """Server spans for every request of a FastAPI app (no-op when tracing is off)."""
    if _state is None:
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    # The console's static files and the health probe are noise in a trace backend.
    FastAPIInstrumentor.instrument_app(
        app, tracer_provider=_state.provider, excluded_urls="/healthz,/metrics,/console/static/.*"
    )


def async_transport(inner: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncBaseTransport | None:
    """An httpx transport that makes a client span for every request and sends `traceparent`, wrapping `inner`
    (default: a plain `AsyncHTTPTransport` with no retries). Returns `inner` unchanged when tracing is off."""
    if _state is None:
        return inner
    import httpx
    from opentelemetry.instrumentation.httpx import AsyncOpenTelemetryTransport

    return AsyncOpenTelemetryTransport(inner or httpx.AsyncHTTPTransport(retries=0), tracer_provider=_state.provider)


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the current span, to store with work done later elsewhere (outbox rows)."""
    if _state is None:
        return None
    from opentelemetry.propagators.textmap import default_setter
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, setter=default_setter)
    return carrier.get("traceparent")


@contextlib.contextmanager
def span(name: str, *, traceparent: str | None = None, attributes: dict[str, Any] | None = None) -> Iterator[Any]:
    """A span named `name`, child of `traceparent` when given (else of the current span). No-op when off."""
    if _state is None:
        yield None
        return
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    ctx = TraceContextTextMapPropagator().extract({"traceparent": traceparent}) if traceparent else None
    with _state.tracer().start_as_current_span(name, context=ctx, attributes=attributes) as s:
        try:
            yield s
        except Exception as exc:
            s.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)[:200]))
            raise


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) in hex of the current span, for log lines; None outside a span or when off."""
    if _state is None:
        return None
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")
