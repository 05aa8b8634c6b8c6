"""What a work item declares about its preview (`validation.preview`): how to start the changed app, when it is
ready, how long it may live, and the HTTP probes and browser flows that must pass. Parsed once, at submission: a
bad field is a 422 naming it (`validation.preview.http.0.expect.1.regex`); everything below receives values that
cannot be malformed.

Every string here comes from a tenant and is used on the host (paths joined to the app's origin, headers sent by
httpx, regular expressions run over response bodies, texts handed to Playwright's locators), so each is bounded,
free of control characters, and regular expressions are RE2 (linear time: a pattern cannot hang the worker).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

MAX_HTTP_PROBES = 32
MAX_FLOWS = 8
MAX_STEPS = 64
MAX_ASSERTIONS = 16
MAX_TEXT = 2_000
MAX_BODY_BYTES = 64 * 1024
MAX_LIFETIME_S = 1_800.0
MAX_ENV = 32


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _no_controls(v: str) -> str:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in v):
        raise ValueError("must not contain control characters (newlines included)")
    return v


def _path_and_query(v: str) -> str:
    """A path on the app's own origin: never a scheme, a host, `//host`, a backslash or a fragment."""
    _no_controls(v)
    if not v.startswith("/") or v.startswith("//") or "\\" in v or "#" in v or " " in v:
        raise ValueError("must be a path on the app's origin starting with one `/` (no scheme, host, `#` or spaces)")
    return v


def _regex(v: str) -> str:
    import re2  # google-re2: linear-time matching whatever the pattern

    options = re2.Options()
    options.log_errors = False
    try:
        re2.compile(v, options)
    except Exception as exc:  # re2.error is not an Exception subclass in every version
        raise ValueError(f"is not a valid RE2 regular expression: {exc}") from None
    return v


Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT), AfterValidator(_no_controls)]
PathAndQuery = Annotated[str, Field(min_length=1, max_length=2_048), AfterValidator(_path_and_query)]
Regex = Annotated[str, Field(min_length=1, max_length=512), AfterValidator(_regex)]
ProbeName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
Timeout = Annotated[float, Field(gt=0, le=300)]

_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")
# Framing and routing are the platform's: a probe cannot smuggle a second request or talk to another host.
_RESERVED_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer"}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# Set by the platform; a preview's own `env` cannot change where the app listens or what it runs.
_RESERVED_ENV = {"PORT", "HOST", "PATH", "HOME", "CREWWORK_PREVIEW", "CREWWORK_ENV"}


# ------------------------------------------------------------------------------------------------ start


Framework = Literal["fastapi", "flask", "django", "static", "vite"]


class StartSpec(_Strict):
    """How to start the app: an explicit command, or a row of the detection table (crewwork/preview/detect.py)."""

    command: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="argv run at the workspace root. `{port}` in an argument is replaced by the port crewwork "
        "assigned (also in $PORT). Unset: detected from the repository, or from `framework`.",
    )
    framework: Framework | None = Field(
        default=None, description="Use this row of the detection table instead of detecting one."
    )
    directory: Annotated[str, Field(max_length=256, pattern=r"^[A-Za-z0-9_.][A-Za-z0-9_./-]*$")] | None = Field(
        default=None, description="`static`: the directory to serve (default: detected: `.`, `public`, `dist`, `site`)."
    )
    env: dict[str, str] = Field(default_factory=dict, description="More environment variables for the app.")

    @field_validator("command")
    @classmethod
    def _argv(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            if not v[0].strip():
                raise ValueError("command[0] must name a program")
            for a in v:
                if "\x00" in a or len(a) > 4_096:
                    raise ValueError("arguments must not contain NUL bytes or exceed 4096 characters")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_ENV:
            raise ValueError(f"at most {MAX_ENV} variables")
        for k, val in v.items():
            if not _ENV_NAME.match(k) or k in _RESERVED_ENV:
                raise ValueError(
                    f"{k!r} is not a variable name a preview may set ({', '.join(sorted(_RESERVED_ENV))} are the platform's)"
                )
            if "\x00" in val or len(val) > 4_096:
                raise ValueError(f"the value of {k} must not contain NUL bytes or exceed 4096 characters")
        return v

    @model_validator(mode="after")
    def _one_way(self) -> StartSpec:
        if self.command is not None and self.framework is not None:
            raise ValueError("give `command` or `framework`, not both")
        return self


class ReadySpec(_Strict):
    """When the app counts as ready: an HTTP path answering 2xx, 3xx or 400-403, or a line in its output."""

    http: PathAndQuery | None = Field(default=None, description="Path polled until it answers (default `/`).")
    log: Regex | None = Field(default=None, description="RE2 pattern a line of the app's output must match.")
    timeout_s: Timeout = Field(default=60.0, description="Deadline from start; `preview_not_ready` after it.")

    @model_validator(mode="after")
    def _one(self) -> ReadySpec:
        if self.http is not None and self.log is not None:
            raise ValueError("give `http` or `log`, not both")
        return self


# ------------------------------------------------------------------------------------------------ HTTP probes


class Contains(_Strict):
    contains: Text


class NotContains(_Strict):
    not_contains: Text


class Matches(_Strict):
    regex: Regex


class JsonEquals(_Strict):
    json_path: Annotated[str, Field(max_length=256, pattern=r"^\$((\.[A-Za-z_][A-Za-z0-9_-]*)|(\[\d{1,6}\]))*$")] = (
        Field(description="`$`, `$.a.b`, `$.items[0].name`: a path into the JSON body.")
    )
    equals: Any = Field(description="The value found there must equal this (JSON equality).")


def _key_of(keys: tuple[str, ...]) -> Any:
    def pick(v: Any) -> str | None:
        if isinstance(v, BaseModel):
            v = v.model_dump()
        if isinstance(v, dict):
            found = [k for k in keys if k in v]
            return found[0] if len(found) == 1 else None
        return None

    return pick


BodyAssertion = Annotated[
    Annotated[Contains, Tag("contains")]
    | Annotated[NotContains, Tag("not_contains")]
    | Annotated[Matches, Tag("regex")]
    | Annotated[JsonEquals, Tag("json_path")],
    Discriminator(
        _key_of(("contains", "not_contains", "regex", "json_path")),
        custom_error_type="assertion",
        custom_error_message="an assertion is one of {contains}, {not_contains}, {regex} or {json_path, equals}",
    ),
]

Method = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class HttpProbe(_Strict):
    """One request to the running app and what its answer must be."""

    name: ProbeName
    method: Method = "GET"
    path: PathAndQuery = "/"
    headers: dict[str, str] = Field(default_factory=dict, description="Request headers (not Host or framing).")
    body: str | None = Field(default=None, max_length=MAX_BODY_BYTES, description="Request body (text).")
    json_body: Any = Field(default=None, alias="json", description="Request body as JSON (sets Content-Type).")
    status: list[Annotated[int, Field(ge=100, le=599)]] = Field(
        default_factory=lambda: [200], min_length=1, max_length=16, description="Statuses that pass (default 200)."
    )
    expect: list[BodyAssertion] = Field(default_factory=list, max_length=MAX_ASSERTIONS)
    timeout_s: Timeout = 10.0

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)

    @field_validator("status", mode="before")
    @classmethod
    def _one_status(cls, v: Any) -> Any:
        return [v] if isinstance(v, int) else v

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > 32:
            raise ValueError("at most 32 headers")
        for k, val in v.items():
            if not _HEADER_NAME.match(k) or k.lower() in _RESERVED_HEADERS:
                raise ValueError(f"{k!r} is not a header a probe may set")
            if len(val) > 4_096 or any(ord(c) < 0x20 and c != "\t" for c in val) or "\x7f" in val:
                raise ValueError(f"the value of {k} has a control character or is over 4096 characters")
        return v

    @model_validator(mode="after")
    def _one_body(self) -> HttpProbe:
        if self.body is not None and self.json_body is not None:
            raise ValueError("give `body` or `json`, not both")
        if self.json_body is not None:
            import json

            if len(json.dumps(self.json_body)) > MAX_BODY_BYTES:
                raise ValueError(f"`json` is over {MAX_BODY_BYTES} bytes")
        return self


# ------------------------------------------------------------------------------------------------ browser flows


class Target(_Strict):
    """An element, found the way a person would: by ARIA role (and accessible name), visible text, test id or label."""

    role: Annotated[str, Field(pattern=r"^[a-z]{2,32}$")] | None = None
    name: Text | None = Field(default=None, description="With `role`: the accessible name.")
    text: Text | None = None
    test_id: Annotated[str, Field(min_length=1, max_length=128), AfterValidator(_no_controls)] | None = None
    label: Text | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Target:
        ways = [k for k in ("role", "text", "test_id", "label") if getattr(self, k) is not None]
        if len(ways) != 1:
            raise ValueError("name the element one way: `role` (with `name`), `text`, `test_id` or `label`")
        if self.name is not None and self.role is None:
            raise ValueError("`name` goes with `role`")
        return self


class Open(_Strict):
    open: PathAndQuery


class Click(_Strict):
    click: Target


class Fill(_Strict):
    fill: Target
    value: Annotated[str, Field(max_length=10_000)]


class Press(_Strict):
    press: Target
    key: Annotated[str, Field(pattern=r"^[A-Za-z0-9+]{1,32}$", description="A key name: `Enter`, `Tab`, `a`.")]


class WaitForText(_Strict):
    wait_for_text: Text


Step = Annotated[
    Annotated[Open, Tag("open")]
    | Annotated[Click, Tag("click")]
    | Annotated[Fill, Tag("fill")]
    | Annotated[Press, Tag("press")]
    | Annotated[WaitForText, Tag("wait_for_text")],
    Discriminator(
        _key_of(("open", "click", "fill", "press", "wait_for_text")),
        custom_error_type="step",
        custom_error_message="a step is one of {open}, {click}, {fill, value}, {press, key} or {wait_for_text}",
    ),
]


class TextVisible(_Strict):
    text_visible: Text


class NoConsoleErrors(_Strict):
    no_console_errors: Literal[True]


class NoFailedRequests(_Strict):
    no_failed_requests: Literal[True]


class UrlIs(_Strict):
    url: PathAndQuery


FlowAssertion = Annotated[
    Annotated[TextVisible, Tag("text_visible")]
    | Annotated[NoConsoleErrors, Tag("no_console_errors")]
    | Annotated[NoFailedRequests, Tag("no_failed_requests")]
    | Annotated[UrlIs, Tag("url")],
    Discriminator(
        _key_of(("text_visible", "no_console_errors", "no_failed_requests", "url")),
        custom_error_type="assertion",
        custom_error_message="a flow assertion is one of {text_visible}, {no_console_errors: true}, "
        "{no_failed_requests: true} or {url}",
    ),
]


class BrowserFlow(_Strict):
    """Steps in a real (sandboxed) Chromium, then assertions on what the page shows and did."""

    name: ProbeName
    steps: list[Step] = Field(min_length=1, max_length=MAX_STEPS)
    expect: list[FlowAssertion] = Field(default_factory=list, max_length=MAX_ASSERTIONS)
    step_timeout_s: Timeout = Field(default=10.0, description="How long one step may wait for its element or text.")


# ------------------------------------------------------------------------------------------------ the preview


class PreviewSpec(_Strict):
    """`validation.preview`: after the tests pass, start the change and probe it (docs/preview.md)."""

    start: StartSpec = Field(default_factory=StartSpec)
    ready: ReadySpec = Field(default_factory=ReadySpec)
    lifetime_s: Annotated[float, Field(gt=0, le=MAX_LIFETIME_S)] = Field(
        default=300.0, description="The app is stopped after this long whatever happens (`preview_limit`)."
    )
    http: list[HttpProbe] = Field(default_factory=list, max_length=MAX_HTTP_PROBES)
    browser: list[BrowserFlow] = Field(default_factory=list, max_length=MAX_FLOWS)

    @model_validator(mode="after")
    def _probes(self) -> PreviewSpec:
        if not self.http and not self.browser:
            raise ValueError("a preview needs at least one probe (`http` or `browser`)")
        names = [p.name for p in self.http] + [f.name for f in self.browser]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"probe names must be unique; repeated: {', '.join(dup)}")
        return self

    def probe_ids(self) -> list[str]:
        """The id of every declared probe, as evidence and test results name them."""
        return [probe_id("http", p.name) for p in self.http] + [probe_id("browser", f.name) for f in self.browser]


def probe_id(kind: str, name: str) -> str:
    return f"preview::{kind}::{name}"
