"""Error intake (docs/errors-intake.md): error events from the tools teams already run (the Sentry SDK's envelopes,
OpenTelemetry exception events) read into one neutral `ErrorReport`, fingerprinted, and turned into hotfix work
items, one per fingerprint at a time.

reports.py   ErrorReport, the fingerprint, the bounded decompression of a request body
sentry.py    the Sentry envelope and legacy store payloads
otel.py      OTLP/HTTP logs and traces (JSON or protobuf): their exception events
work.py      the hotfix work item a group of reports becomes (the report's text fenced as untrusted data)
"""
