"""OpenTelemetry end to end on real Temporal, PostgreSQL and HTTP: one submission yields one trace that holds the API
request, the workflow start and run, its activities, the model call (a real local server speaking the OpenAI
protocol) and the webhook delivery (made later, by the API's outbox deliverer), and JSON log lines carry its id."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from crewwork.config import Settings
from crewwork.observability import tracing
from crewwork.observability.logs import ContextFilter, JsonFormatter
from crewwork.temporal.devserver import DevServer, free_port
from tests.api.conftest import LiveApi
from tests.api.test_api_webhooks import Receiver
from tests.conftest import make_settings, running_crew
from tests.fakes.openai_server import FakeOpenAIServer, Reply

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

KEY = "sk-trace-0123456789abcdefghij"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    tracing.use_provider(provider)
    try:
        yield exp
    finally:
        tracing.disable()
        provider.shutdown()


@pytest.fixture
def provider_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAIServer]:
    monkeypatch.setenv("FAKE_PROVIDER_KEY", KEY)
    monkeypatch.setenv(
        "CREWWORK_MODEL_ENDPOINTS",
        json.dumps({"allowed_key_envs": ["FAKE_PROVIDER_KEY"], "allow_work_item_endpoints": True}),
    )
    with FakeOpenAIServer() as server:
        yield server


def _hex(span: ReadableSpan) -> str:
    assert span.context is not None
    return format(span.context.trace_id, "032x")


async def test_one_submission_is_one_trace_from_the_api_through_temporal_to_the_model_and_the_webhook(
    tmp_path: Path,
    temporal_server: DevServer,
    pg_url: str,
    sandbox_backend: str,
    exporter: InMemorySpanExporter,
    provider_server: FakeOpenAIServer,
) -> None:
    settings: Settings = make_settings(
        tmp_path, temporal_server, pg_url, sandbox_backend=sandbox_backend, outbound_allow_networks="127.0.0.0/8"
    )
    provider_server.enqueue(Reply.text("the answer is 42", prompt_tokens=12, completion_tokens=5))
    receiver = Receiver(free_port())
    receiver.start()
    log_buf = io.StringIO()
    handler = logging.StreamHandler(log_buf)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter())
    activity_log = logging.getLogger("crewwork.activity")
    old_level = activity_log.level
    activity_log.addHandler(handler)
    activity_log.setLevel(logging.DEBUG)
    try:
        async with running_crew(settings) as crew:
            _kid, key = await crew.store.create_api_key(f"trace-{time.time_ns()}")
            api = LiveApi(settings).start()
            try:
                async with httpx.AsyncClient(
                    base_url=api.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
                ) as c:
                    hook = await c.post("/v1/webhooks", json={"url": f"http://127.0.0.1:{receiver.port}/hook"})
                    assert hook.status_code == 201, hook.text
                    r = await c.post(
                        "/v1/work-items",
                        json={
                            "kind": "task",
                            "input": {"question": "what is six times seven?"},
                            "agent": {
                                "name": "model",
                                "config": {
                                    "endpoints": {
                                        "fake": provider_server.endpoint_config(api_key_env="FAKE_PROVIDER_KEY")
                                    }
                                },
                            },
                        },
                    )
                    assert r.status_code == 202, r.text
                    wid = r.json()["id"]
                    deadline = time.monotonic() + 90
                    delivered: list[tuple[dict[str, str], bytes]] = []
                    while time.monotonic() < deadline:
                        delivered = [
                            (h, b)
                            for h, b in list(receiver.received)
                            if json.loads(b).get("work_item_id") == wid and json.loads(b).get("state") == "succeeded"
                        ]
                        if delivered:
                            break
                        await asyncio.sleep(0.1)
                    assert delivered, f"no webhook announced that {wid} succeeded"
                    # The deliverer marks the row delivered after the response: give its spans a moment to end.
                    await asyncio.sleep(0.5)
            finally:
                api.stop()
    finally:
        receiver.stop()
        activity_log.removeHandler(handler)
        activity_log.setLevel(old_level)

    spans = list(exporter.get_finished_spans())
    roots = [
        s
        for s in spans
        if s.name == "POST /v1/work-items"
        and s.kind.name == "SERVER"
        and (s.attributes or {}).get("http.status_code") in (202, None)
    ]
    assert roots, sorted({s.name for s in spans})
    trace_id = _hex(roots[0])
    mine = [s for s in spans if _hex(s) == trace_id]
    names = {s.name for s in mine}

    # API -> workflow start -> workflow run -> activities, one trace.
    assert "StartWorkflow:WorkItemWorkflow" in names, names
    assert "RunWorkflow:WorkItemWorkflow" in names, names
    # Admitted in the submission's request (crewwork/admission/starts.py): no admit step in the workflow.
    assert {"RunActivity:run_agent", "RunActivity:finish"} <= names and "RunActivity:admit" not in names, names

    by_id = {s.context.span_id: s for s in mine if s.context is not None}

    def ancestors(s: ReadableSpan) -> list[str]:
        out = []
        while s.parent is not None and s.parent.span_id in by_id:
            s = by_id[s.parent.span_id]
            out.append(s.name)
        return out

    # The model call: an httpx client span to the provider, inside the run_agent activity.
    model_calls = [
        s
        for s in mine
        if (s.kind.name == "CLIENT" and "/chat/completions" in str((s.attributes or {}).get("url.full", "")))
        or "/chat/completions" in str((s.attributes or {}).get("http.url", ""))
    ]
    assert model_calls, [(s.name, dict(s.attributes or {})) for s in mine if s.kind.name == "CLIENT"]
    assert "RunActivity:run_agent" in ancestors(model_calls[0])
    assert provider_server.chat_requests[0].headers.get("traceparent", "").split("-")[1] == trace_id

    # The webhook delivery: made later by the API's outbox deliverer, yet in the same trace, with its HTTP call.
    deliveries = [s for s in mine if s.name == "webhook.deliver"]
    assert deliveries, names
    assert any(s.kind.name == "CLIENT" and "webhook.deliver" in ancestors(s) for s in mine), (
        "the delivery's HTTP request is a child span of webhook.deliver"
    )
    headers, _body = delivered[0]
    assert headers["traceparent"].split("-")[1] == trace_id, "the receiver can continue the trace"

    # JSON log lines written inside the activities carry the trace and span ids.
    lines = [json.loads(ln) for ln in log_buf.getvalue().splitlines() if ln.startswith("{")]
    mine_logs = [ln for ln in lines if ln.get("work_item_id") == wid]
    assert mine_logs, lines[:3]
    assert all(ln.get("trace_id") == trace_id and len(ln.get("span_id", "")) == 16 for ln in mine_logs), mine_logs[:2]


def test_tracing_is_off_unless_the_otel_variables_ask_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    assert tracing.exporter_names(Settings()) == []
    assert tracing.exporter_names(Settings(otel_exporter_otlp_endpoint="http://127.0.0.1:4317")) == ["otlp"]
    assert tracing.exporter_names(Settings(otel_traces_exporter="console,otlp")) == ["console", "otlp"]
    assert tracing.exporter_names(Settings(otel_traces_exporter="none", otel_exporter_otlp_endpoint="x")) == []
    assert tracing.exporter_names(Settings(otel_traces_exporter="console", otel_sdk_disabled=True)) == []
    with pytest.raises(tracing.TracingConfigError, match="no installed package provides"):
        tracing._load_exporter("no-such-exporter")
    assert not tracing.enabled() and tracing.client_interceptors() == [] and tracing.current_traceparent() is None


def test_the_otel_variables_configure_the_sdk_in_a_process_of_its_own(tmp_path: Path) -> None:
    """Without a provider handed in, `configure` builds one from OTEL_* (here the SDK's console exporter) and makes
    it the global provider; an exporter that is not installed stops start-up naming what to install."""
    import os
    import subprocess
    import sys

    code = (
        "from crewwork.observability import tracing\n"
        "from crewwork.config import Settings\n"
        "assert tracing.configure(Settings(), 'crewwork-test')\n"
        "with tracing.span('hello', attributes={'k': 'v'}):\n"
        "    print('traceparent', tracing.current_traceparent(), flush=True)\n"
        "tracing.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    res = subprocess.run(
        [sys.executable, "-c", code], env={**env, "OTEL_TRACES_EXPORTER": "console"}, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert '"name": "hello"' in res.stdout and '"service.name": "crewwork-test"' in res.stdout, res.stdout
    assert "traceparent 00-" in res.stdout
    named = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "my-api"},
        capture_output=True,
        text=True,
    )
    assert '"service.name": "my-api"' in named.stdout, named.stdout
    bad = subprocess.run(
        [sys.executable, "-c", code], env={**env, "OTEL_TRACES_EXPORTER": "zipkin_nope"}, capture_output=True, text=True
    )
    assert bad.returncode != 0 and "no installed package provides" in bad.stderr and "crewwork[otel]" in bad.stderr
