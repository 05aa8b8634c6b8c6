"""The outcome witness: a pytest plugin crewwork loads into every pytest run it validates with.

This file runs *inside the sandbox*, under the repository's own interpreter and pytest, so it imports nothing but the
standard library and pytest, and keeps to syntax old interpreters read. The validate step copies it, as
`crewwork_witness.py`, into a host directory mounted read-only, puts that directory on PYTHONPATH and adds
`-p crewwork_witness` to PYTEST_ADDOPTS: pytest imports it while parsing its arguments, before any conftest, plugin
entry point, test module or module of the package under test.

It records, for every test, what the runner itself saw, below the places a change usually rewrites reports:

- the raw exception (or none) of each phase as the runner's own `CallInfo` holds it when `pytest_runtest_makereport`
  reaches this plugin's innermost wrapper, and again once the runner's own implementations made the report (the
  unittest plugin attaches a TestCase's failure only then), before that hook's outer wrappers can touch it;
- the raw exception (or none) of the test function itself (`pytest_pyfunc_call`), below any wrapper around the call;
- whether the test carried an xfail marker, and for a test (or a whole module) skipped or xfailed, where the code
  that skipped it is (`path:line`, the innermost frame that is neither pytest's nor hidden from tracebacks);
- how many tests were collected, deselected (`pytest_deselected`, as `-k`, `-m` and `--deselect` report it) and
  selected, and, once the session ends, its exit status.

Records go, one JSON object a line, to `$CREWWORK_WITNESS_DIR/<pid>.jsonl`, a file this process creates exclusively
and holds open for appending. A stream starts with a `start` record and ends with an `end` record; the host reads
every stream and compares them with the report (crewwork.validation.witness). What this cannot do, and why, is in
docs/lifecycle.md ("What judges cannot be changed by what is judged").
"""

from __future__ import annotations

import json
import os
import sys
import unittest

import pytest

_write = os.write
_dumps = json.dumps
_getpid = os.getpid
_DIR = os.environ.get("CREWWORK_WITNESS_DIR") or ""
_SKIPS = (pytest.skip.Exception, unittest.SkipTest)
_XFAIL = pytest.xfail.Exception
_ROOT = os.path.dirname(os.path.dirname(_DIR)) if _DIR else os.getcwd()
_RUNNER_DIRS = tuple(
    os.path.dirname(getattr(m, "__file__", None) or "/nonexistent/x") + os.sep
    for m in (pytest, sys.modules.get("_pytest"), sys.modules.get("pluggy"), unittest)
    if m is not None
)
_state: dict = {"fd": None, "tests": 0, "worker": None, "collected": 0, "deselected": 0, "selected": None}
_phases: dict = {}
_function: dict = {}
_origins: dict = {}


def _open():
    if _state["fd"] is None and _DIR:
        try:
            os.makedirs(_DIR, exist_ok=True)
        except OSError:
            pass
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        _state["fd"] = os.open(os.path.join(_DIR, f"{_getpid()}.jsonl"), flags, 0o644)
    return _state["fd"]


def _record(record: dict) -> None:
    fd = _open()
    if fd is not None:
        _write(fd, (_dumps(record, sort_keys=True) + "\n").encode("utf-8", "replace"))


def _kind(exc_type) -> str:
    """What one raised exception (or None) means: passed, skipped, xfailed or raised."""
    if exc_type is None:
        return "passed"
    if issubclass(exc_type, _XFAIL):
        return "xfailed"
    if issubclass(exc_type, _SKIPS):
        return "skipped"
    return "raised"


def _origin(tb) -> str | None:
    """`path:line` (relative to the workspace) of the innermost frame that ended a test and is neither the runner's
    nor hidden from tracebacks (`__tracebackhide__`, as pytest.skip is): who called skip, xfail or fail."""
    found = None
    while tb is not None:
        frame = tb.tb_frame
        path = frame.f_code.co_filename
        hidden = frame.f_locals.get("__tracebackhide__") or frame.f_globals.get("__tracebackhide__")
        if not hidden and not path.startswith(_RUNNER_DIRS):
            found = (path, tb.tb_lineno)
        tb = tb.tb_next
    if found is None:
        return None
    path = os.path.relpath(found[0], _ROOT) if os.path.isabs(found[0]) else found[0]
    return f"{path}:{found[1]}"


_record({"k": "start", "pid": _getpid(), "pytest": pytest.__version__, "python": sys.version.split()[0]})


def pytest_configure(config) -> None:
    worker = getattr(config, "workerinput", None)
    _state["worker"] = worker.get("workerid") if isinstance(worker, dict) else None
    # Which report this session writes, so the host compares it only with the sessions that wrote that report (a
    # test that starts pytest in a subprocess starts a session of its own).
    xml = getattr(config.option, "xmlpath", None)
    report = os.path.relpath(os.path.abspath(str(xml)), _ROOT) if xml else None
    _record({"k": "configure", "worker": _state["worker"], "report": report})


def pytest_itemcollected(item) -> None:
    _state["collected"] += 1


def pytest_deselected(items) -> None:
    _state["deselected"] += len(items)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session) -> None:
    _state["selected"] = len(session.items)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtestloop(session):
    # Only a loop that runs tests must run every selected one (not --collect-only, which returns at once).
    _state["looped"] = not session.config.option.collectonly
    yield


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report is not None and report.outcome == "skipped" and isinstance(report.longrepr, tuple):
        path, line = report.longrepr[0], report.longrepr[1]
        where = os.path.relpath(path, _ROOT) if os.path.isabs(str(path)) else str(path)
        _record({"k": "collect", "id": collector.nodeid, "outcome": "skipped", "origin": f"{where}:{line}"})


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_pyfunc_call(pyfuncitem):
    outcome = yield
    excinfo = outcome.excinfo
    _function[pyfuncitem.nodeid] = _kind(excinfo[0] if excinfo else None)


_WORSE = {"passed": 0, "skipped": 1, "xfailed": 2, "raised": 3}


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_makereport(item, call):
    raw = _kind(call.excinfo.type if call.excinfo is not None else None)
    if raw in ("skipped", "xfailed"):
        _origins.setdefault(item.nodeid, _origin(call.excinfo.tb))
    outcome = yield
    # After the runner's own implementations, before any outer wrapper rewrites: the exception they attached (the
    # unittest plugin attaches a TestCase's failure only now) and the report they made count too, the worse wins.
    after = _kind(call.excinfo.type if call.excinfo is not None else None)
    try:
        made = outcome.get_result()
    except BaseException:
        made = None
    if after == "passed" and getattr(made, "outcome", None) == "failed":
        after = "raised"
    if _WORSE[after] > _WORSE[raw]:
        if after in ("skipped", "xfailed") and call.excinfo is not None:
            _origins.setdefault(item.nodeid, _origin(call.excinfo.tb))
        raw = after
    phases = _phases.setdefault(item.nodeid, {})
    phases[call.when] = raw
    if call.when == "teardown":
        _phases.pop(item.nodeid, None)
        _state["tests"] += 1
        _record(
            {
                "k": "test",
                "id": item.nodeid,
                "setup": phases.get("setup"),
                "call": phases.get("call"),
                "teardown": raw,
                "function": _function.pop(item.nodeid, None),
                "xfail": any(True for _ in item.iter_markers("xfail")),
                "origin": _origins.pop(item.nodeid, None),
            }
        )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    for nodeid, phases in sorted(_phases.items()):
        # A test whose teardown never ran (an interrupted session): what was seen still counts.
        _record({"k": "test", "id": nodeid, "function": _function.pop(nodeid, None), "xfail": False, **phases})
    _phases.clear()
    _record(
        {
            "k": "end",
            "exitstatus": int(exitstatus),
            "tests": _state["tests"],
            "worker": _state["worker"],
            "collected": _state["collected"],
            "deselected": _state["deselected"],
            "selected": _state["selected"],
            "looped": bool(_state.get("looped")),
        }
    )
