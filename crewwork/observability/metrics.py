"""Prometheus metrics, with prometheus-client: this process's counters, gauges and histograms on the library's
default registry (which also carries the process and platform collectors: CPU, memory, open files, GC), plus the
store's projections.

- Process metrics (`HTTP_REQUESTS`, `ACTIVITY_SECONDS`, ...) are counted by each process; Prometheus sums them.
- Store projections (work items by state, attempts by verdict and cause, events by type, the outbox, model tokens)
  describe the one shared store. Only API processes export them (never the pools, so a scrape of the embedded stack
  sees them once per API process; with several API processes aggregate them with `max`), and they come from a
  snapshot refreshed at most every `CREWWORK_METRICS_STORE_REFRESH_S`: however often Prometheus scrapes, the store
  runs its aggregate queries at most that often.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("crewwork.metrics")

# The `_created` series double every counter and histogram; nothing of crewwork reads them.
prometheus_client.disable_created_metrics()

REGISTRY: CollectorRegistry = prometheus_client.REGISTRY
# generate_latest() writes the 0.0.4 text format, which every Prometheus version reads.
CONTENT_TYPE = prometheus_client.CONTENT_TYPE_PLAIN_0_0_4

HTTP_REQUESTS = Counter(
    "crewwork_http_requests", "HTTP requests served by the API.", ("method", "route", "status"), registry=REGISTRY
)
HTTP_LATENCY = Histogram(
    "crewwork_http_request_duration_seconds",
    "HTTP request latency of the API.",
    ("method", "route"),
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)
RATE_LIMITED = Counter("crewwork_rate_limited", "Requests refused with 429 by the rate limits.", registry=REGISTRY)
SSE_CLIENTS = Gauge("crewwork_sse_clients", "Open Server-Sent Events streams.", registry=REGISTRY)
WEBHOOK_DELIVERIES = Counter(
    "crewwork_webhook_deliveries",
    "Webhook delivery attempts by this process, by result.",
    ("result",),
    registry=REGISTRY,
)
ACTIVITY_SECONDS = Histogram(
    "crewwork_activity_duration_seconds",
    "Wall time of activity executions in this pool process, by activity type and outcome.",
    ("activity", "outcome"),
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0),
    registry=REGISTRY,
)
WORKFLOW_STARTS = Counter(
    "crewwork_workflow_starts",
    "Work-item workflows this process started, by how: `eager` (the first workflow task came back in the start's "
    "reply, to this process's control worker: CREWWORK_EAGER_START), `plain`, or `duplicate` (Temporal had the "
    "workflow already: an idempotent retry).",
    ("how",),
    registry=REGISTRY,
)
POOL_INFO = Gauge(
    "crewwork_pool_info", "The pool this process runs (value 1).", ("pool", "task_queue"), registry=REGISTRY
)

SANDBOX_CAP_CAUSES = ("timeout", "oom", "pids")


class StoreProjections(Collector):
    """The store's aggregate counts as gauges, from a snapshot no older than `refresh_s` when a scrape asks.

    `refresh()` (awaited by the /metrics handler before it renders) queries the store only when the snapshot is
    stale, and one refresh at a time; `collect()` (called by prometheus-client while rendering) only reads the
    snapshot."""

    def __init__(self, store: Any, refresh_s: float) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self._snapshot: Any = None
        self._taken = -float("inf")
        self._lock = asyncio.Lock()
        self._read = threading.Lock()

    async def refresh(self) -> None:
        if time.monotonic() - self._taken < self.refresh_s:
            return
        async with self._lock:
            if time.monotonic() - self._taken < self.refresh_s:
                return
            try:
                counts = await self.store.store_counts()
            except Exception as exc:  # a failing projection must not break the scrape: the last snapshot stays,
                # and the next try waits the same interval (a store that is down is not asked on every scrape)
                log.warning("store projections for /metrics failed: %s", exc)
                self._taken = time.monotonic()
                return
            with self._read:
                self._snapshot, self._taken = counts, time.monotonic()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._read:
            counts = self._snapshot
        if counts is None:
            return
        g = GaugeMetricFamily("crewwork_work_items", "Work items by state and kind.", labels=("state", "kind"))
        for (state, kind), n in sorted(counts.work_items.items()):
            g.add_metric((state, kind), n)
        yield g
        g = GaugeMetricFamily(
            "crewwork_attempts", "Recorded attempts by verdict and cause.", labels=("verdict", "cause")
        )
        for (verdict, cause), n in sorted(counts.attempts.items()):
            g.add_metric((verdict, cause), n)
        yield g
        g = GaugeMetricFamily(
            "crewwork_sandbox_cap_hits", "Attempts whose validation hit a sandbox cap, by cause.", labels=("cause",)
        )
        for cause in SANDBOX_CAP_CAUSES:
            g.add_metric((cause,), sum(n for (_v, c), n in counts.attempts.items() if c == cause))
        yield g
        g = GaugeMetricFamily(
            "crewwork_events",
            "Events in the append-only log by type (stale_write_rejected counts rejected fenced writes).",
            labels=("type",),
        )
        for kind, n in sorted(counts.events.items()):
            g.add_metric((kind,), n)
        yield g
        g = GaugeMetricFamily("crewwork_outbox_messages", "Webhook outbox rows by status.", labels=("status",))
        for status, n in sorted(counts.outbox.items()):
            g.add_metric((status,), n)
        yield g
        yield GaugeMetricFamily(
            "crewwork_model_tokens", "Model tokens used across recorded attempts.", value=counts.model_tokens
        )


def render(registry: CollectorRegistry = REGISTRY) -> bytes:
    return prometheus_client.generate_latest(registry)


class MetricsServer:
    """prometheus-client's own /metrics HTTP server (a thread), for pool processes, which have no web framework."""

    def __init__(self, port: int, host: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> None:
        self.server, self.thread = prometheus_client.start_http_server(port, addr=host, registry=registry)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_metrics(port: int, host: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> MetricsServer:
    return MetricsServer(port, host, registry)
