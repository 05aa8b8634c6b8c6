"""Observability of a worker pool process: activity timings, the pool's identity, the Temporal SDK's own metrics
and the /metrics endpoint."""

from __future__ import annotations

import logging
import time
from typing import Any

from crewwork.observability.logs import log_context, work_item_id_from_workflow_id
from crewwork.observability.metrics import ACTIVITY_SECONDS, POOL_INFO, MetricsServer, serve_metrics

# ------------------------------------------------------------------------------------------------ worker pools


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
                    ACTIVITY_SECONDS.labels(activity=info.activity_type, outcome=outcome).observe(took)
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


def start_pool_observability(
    pool: str, task_queue: str, *, metrics_port: int | None, temporal_metrics_port: int | None
) -> MetricsServer | None:
    """Called by a pool process at start, with its settings:

    - `metrics_port` (CREWWORK_METRICS_PORT): crewwork metrics of this process (activity timings, the pool's
      identity, process CPU and memory) at http://0.0.0.0:PORT/metrics; the store's projections are the API's, not
      a pool's;
    - `temporal_metrics_port` (CREWWORK_TEMPORAL_METRICS_PORT): the Temporal SDK runtime metrics (must differ from
      the above).

    JSON logs (CREWWORK_LOG_FORMAT=json) are set up by `crewwork worker` before this runs."""
    if temporal_metrics_port:
        enable_temporal_runtime_metrics(temporal_metrics_port)
    POOL_INFO.labels(pool=pool, task_queue=task_queue).set(1)
    if not metrics_port:
        return None
    return serve_metrics(metrics_port)
