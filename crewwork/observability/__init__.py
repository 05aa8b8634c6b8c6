"""Observability: Prometheus metrics (prometheus-client; `metrics`), structured logs carrying the work item id and
workflow id on every line (`logs`), and a pool process's own instruments (`pools`). Tracing is crewwork.tracing."""

from __future__ import annotations

from crewwork.observability.logs import (
    ContextFilter,
    JsonFormatter,
    TextFormatter,
    configure_logging,
    log_context,
    mask_secrets_in_text,
    work_item_id_from_workflow_id,
)
from crewwork.observability.metrics import (
    CONTENT_TYPE,
    HTTP_LATENCY,
    HTTP_REQUESTS,
    RATE_LIMITED,
    REGISTRY,
    SSE_CLIENTS,
    WEBHOOK_DELIVERIES,
    StoreProjections,
    render,
)
from crewwork.observability.pools import activity_interceptors, start_pool_observability

__all__ = [
    "CONTENT_TYPE",
    "HTTP_LATENCY",
    "HTTP_REQUESTS",
    "RATE_LIMITED",
    "REGISTRY",
    "SSE_CLIENTS",
    "WEBHOOK_DELIVERIES",
    "ContextFilter",
    "JsonFormatter",
    "StoreProjections",
    "TextFormatter",
    "activity_interceptors",
    "configure_logging",
    "log_context",
    "mask_secrets_in_text",
    "render",
    "start_pool_observability",
    "work_item_id_from_workflow_id",
]
