"""Observability: what a process tells its operator.

metrics.py  Prometheus metrics (prometheus-client): counters, histograms, the store's projections, the text format
logs.py     structured logs carrying the work item id and workflow id on every line; secrets masked
pools.py    a pool process's own instruments (activity interceptors, the metrics endpoint)
tracing.py  OpenTelemetry tracing, off unless the standard OTEL_* variables ask for it
"""
