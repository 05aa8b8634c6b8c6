"""What a preview leaves behind as evidence: what the platform saw, never what the app said about itself.

Gathered by `crewwork.preview.run` (the app's run, each exchange, each flow's steps and what the page logged) and
judged by the pure `crewwork.preview.verdict.grade_preview`, so an attempt can be re-graded from these records
without starting anything again. Every text here came from code under test: it is cut to a bound where it is
recorded and treated as data everywhere after.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# What one record keeps of the app's bytes. Assertions are evaluated on exactly these bytes, so grading from the
# stored record decides what the live run decided; where a bound cut what an assertion needs, the assertion is "not
# judged" and fails (crewwork/preview/verdict.py).
MAX_BODY_SEEN = 64 * 1024
MAX_HEADERS_SEEN = 64
# What one flow keeps of what the page logged: every error up to MAX_CONSOLE_ERRORS (and every one counted), the other
# messages sampled (the first and the last MAX_CONSOLE_SAMPLE / 2, and every one counted).
MAX_CONSOLE_ERRORS = 200
MAX_CONSOLE_SAMPLE = 100
MAX_PAGE_ERRORS = 100
MAX_FAILED_REQUESTS = 100
MAX_ENTRY_CHARS = 2_000
MAX_LOG_TAIL = 16 * 1024
ERROR_TYPES = ("error", "assert")
"""Console message types that are errors (`console.error`, a failed `console.assert`)."""


def cut(text: str, limit: int = MAX_ENTRY_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HttpExchange(_Record):
    """One HTTP probe's request and the app's answer (cut), or why there was none."""

    name: str
    method: str
    path: str
    request_headers: dict[str, str] = Field(default_factory=dict)
    request_body: str = ""
    status: int | None = None
    response_headers: list[tuple[str, str]] = Field(default_factory=list)
    body: str = Field(default="", description=f"The first {MAX_BODY_SEEN} bytes of the body, decoded as UTF-8.")
    body_truncated: bool = False
    body_encoding: str | None = Field(
        default=None, description="The body's Content-Encoding when it is not identity: kept raw, never decoded."
    )
    elapsed_s: float = 0.0
    error: str | None = Field(default=None, description="No answer: timeout, connection refused, reset, ...")


class StepRecord(_Record):
    action: str
    target: str
    ok: bool
    error: str | None = None
    duration_s: float = 0.0


class ConsoleEntry(_Record):
    type: str
    text: str
    location: str = ""
    seq: int | None = Field(default=None, description="Its place among all the flow's console messages (from 1).")


class FailedRequest(_Record):
    method: str
    url: str
    failure: str
    """The network error, or `HTTP 500`."""


class FlowRecord(_Record):
    """What one browser flow did and what the page showed and logged."""

    name: str
    steps: list[StepRecord] = Field(default_factory=list)
    visible: dict[str, bool] = Field(
        default_factory=dict, description="For each `text_visible` assertion: whether the text was visible."
    )
    final_url: str | None = Field(default=None, description="The page's path and query at the end (same origin).")
    final_origin_ok: bool = True
    console: list[ConsoleEntry] = Field(
        default_factory=list, description="Every error (up to a bound) and a sample of the other messages."
    )
    console_seen: int = Field(default=0, description="Every console message of the flow, kept or not.")
    console_errors_seen: int = Field(default=0, description="Every console error of the flow, kept or not.")
    page_errors: list[str] = Field(default_factory=list, description="Uncaught exceptions in the page (and workers).")
    page_errors_seen: int = 0
    failed_requests: list[FailedRequest] = Field(default_factory=list)
    failed_requests_seen: int = 0
    cut: list[str] = Field(default_factory=list, description="What a bound cut that cannot change the verdict.")
    not_judged: list[str] = Field(
        default_factory=list, description="What a bound cut that could have changed the verdict: the flow fails."
    )
    page_crashed: bool = False
    page_text: str = Field(default="", description="The start of the page's visible text at the end.")
    error: str | None = Field(default=None, description="The flow could not run to its end (why).")


class AppRun(_Record):
    """How the app's own sandboxed run went, as the sandbox measured it."""

    exited: bool = Field(default=False, description="The app's process ended before the probes were done.")
    exit_code: int | None = None
    timed_out: bool = False
    oom_killed: bool = False
    pids_limited: bool = False
    disk_limited: bool = False
    killed_by_signal: int | None = None


class PreviewEvidence(_Record):
    """Everything `grade_preview` looks at."""

    command: list[str] = Field(default_factory=list, description="What was started (after detection).")
    detected: str | None = Field(default=None, description="The detection table's row, if detected.")
    port: int | None = Field(default=None, description="The port crewwork assigned ($PORT).")
    started: bool = True
    start_error: str | None = Field(default=None, description="Why nothing could be started (no command found).")
    ready: bool = False
    ready_after_s: float | None = None
    ready_detail: str | None = Field(default=None, description="The last readiness answer or error seen.")
    run: AppRun = Field(default_factory=AppRun)
    log_tail: str = ""
    log_truncated: bool = False
    http: list[HttpExchange] = Field(default_factory=list)
    flows: list[FlowRecord] = Field(default_factory=list)
