"""The baseline at the base commit and flaky tests (issue 45, items 2 and 3): the pure comparison on crafted
evidence, then end to end on a repository the test makes, through real Temporal, PostgreSQL, git, bubblewrap and
pytest (a flaky test that fails on its first run needs a counter outside the tree, so that one case runs on the
`local` backend, whose runs share the host's files).

The repository: `add` is broken at the base (test_add fails there), `mul` works (test_mul passes there), and
tests/test_legacy.py fails at the base and after whatever the change does (the repository's pre-existing failure).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crewwork.cli.repos import _flaky_line
from crewwork.models import ValidationSpec
from crewwork.steps.validate import validation_budget_s
from crewwork.temporal.devserver import DevServer
from crewwork.validation.baseline import BaselineEvidence, RunFacts
from crewwork.validation.grading import Cause, ValidationEvidence, grade, run_facts
from tests.conftest import ApiServer, Crew, make_repo
from tests.security.conftest import PYTEST, code_change, crew_on, scripted

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
FIXED = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
BROKEN_MUL = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a + b\n"
TESTS = (
    "from calc import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_mul():\n    assert mul(2, 3) == 6\n"
)
LEGACY = "def test_legacy():\n    assert 'the repository' == 'already broken'\n"
ADD, MUL, LEGACY_ID = (
    "tests/test_calc.py::test_add",
    "tests/test_calc.py::test_mul",
    "tests/test_legacy.py::test_legacy",
)


def validation(**kw: Any) -> dict[str, Any]:
    return {"command": PYTEST, "junit_path": ".crewwork/junit.xml", "timeout_s": 120, "baseline": "compare", **kw}


def item(repo: Path, calc: str, **val: Any) -> dict[str, Any]:
    return code_change(repo, scripted({"files": {"calc.py": calc}}), validation(**val), review={"required": False})


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "repo",
        {"calc.py": BUGGY, "tests/test_calc.py": TESTS, "tests/test_legacy.py": LEGACY, "conftest.py": ""},
    )


async def repository_id(crew: Crew) -> str:
    """The registration the item's repository got on first use: what the flaky list is kept under."""
    (registration,) = await crew.store.list_repositories(crew.tenant_id)
    return registration.id


# ---------------------------------------------------------------- the pure comparison


def junit(*cases: tuple[str, str]) -> bytes:
    body = "".join(
        f'<testcase classname="tests.test_calc" name="{name}">'
        + ("<failure message='boom'>boom</failure>" if outcome == "failed" else "")
        + "</testcase>"
        for name, outcome in cases
    )
    failures = sum(1 for _, o in cases if o == "failed")
    return (
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="{len(cases)}" failures="{failures}" '
        f'errors="0" skipped="0">{body}</testsuite></testsuites>'
    ).encode()


def after_run(*cases: tuple[str, str], baseline: BaselineEvidence | None = None) -> ValidationEvidence:
    failing = any(o == "failed" for _, o in cases)
    return ValidationEvidence(
        diff_nonempty=True, exit_code=1 if failing else 0, report=junit(*cases), baseline=baseline
    )


def facts(label: str, *cases: tuple[str, str], candidates: set[str] | None = None) -> RunFacts:
    return run_facts(after_run(*cases), label, candidates)


def test_a_failure_at_the_base_too_is_pre_existing_and_does_not_block_but_a_regression_does() -> None:
    base = BaselineEvidence(
        mode="compare", base_commit="b" * 40, base=facts("baseline", ("test_a", "failed"), ("test_b", "passed"))
    )
    only_old = grade(after_run(("test_a", "failed"), ("test_b", "passed"), baseline=base))
    assert only_old.passed and only_old.cause == Cause.passed, only_old
    assert only_old.pre_existing == ["tests/test_calc.py::test_a"] and only_old.failing_tests == []
    assert "pre-existing" in only_old.reason and only_old.baseline and "1 failing" in only_old.baseline

    broke = grade(after_run(("test_a", "failed"), ("test_b", "failed"), baseline=base))
    assert not broke.passed and broke.cause == Cause.test_failure
    assert broke.failing_tests == ["tests/test_calc.py::test_b"] and broke.pre_existing == [
        "tests/test_calc.py::test_a"
    ]
    assert "regressions" in broke.reason

    fixed = grade(after_run(("test_a", "passed"), ("test_b", "passed"), baseline=base))
    assert fixed.passed  # nothing failed: the baseline did not even need to run, but it names nothing wrong

    from crewwork.validation.diagnostics import build_diagnostics

    told = build_diagnostics(broke, None, 1, None)
    assert "## Baseline on the base commit" in told and "Failing at the base commit too" in told, told
    assert "## Failing tests (1)\n- tests/test_calc.py::test_b (failed)" in told, told

    blocking = base.model_copy(update={"mode": "block"})
    blocked = grade(after_run(("test_a", "failed"), ("test_b", "passed"), baseline=blocking))
    assert not blocked.passed and blocked.failing_tests == ["tests/test_calc.py::test_a"], blocked
    assert "validation.baseline: block" in blocked.reason
    # Without a baseline, today's rule: any failing test fails the attempt.
    assert grade(after_run(("test_a", "failed"), ("test_b", "passed"))).cause == Cause.test_failure


def test_a_fix_is_counted_and_a_flaky_test_neither_passes_nor_fails() -> None:
    base = BaselineEvidence(
        mode="compare",
        base_commit="c" * 40,
        base=facts("baseline", ("test_a", "failed"), ("test_b", "passed"), ("test_c", "failed")),
        reruns=[
            facts("rerun 1", ("test_b", "passed"), ("test_d", "passed"), candidates={"tests/test_calc.py::test_d"})
        ],
    )
    v = grade(
        after_run(("test_a", "passed"), ("test_b", "passed"), ("test_c", "failed"), ("test_d", "failed"), baseline=base)
    )
    assert v.passed, v
    assert v.fixed == ["tests/test_calc.py::test_a"] and v.pre_existing == ["tests/test_calc.py::test_c"]
    assert v.flaky == ["tests/test_calc.py::test_d: failed in the change's run; passed in rerun 1"], v.flaky
    # Flaky and pre-existing tests alone show nothing works: not a pass.
    alone = grade(after_run(("test_c", "failed"), ("test_d", "failed"), baseline=base))
    assert not alone.passed and "nothing shows the change works" in alone.reason, alone


def test_a_baseline_or_rerun_cut_by_a_bound_never_makes_anything_pass() -> None:
    timed_out = run_facts(
        ValidationEvidence(diff_nonempty=True, exit_code=None, timed_out=True, report=None), "baseline"
    )
    assert not timed_out.usable and timed_out.cause == "timeout"
    base = BaselineEvidence(mode="compare", base_commit="d" * 40, base=timed_out)
    v = grade(after_run(("test_a", "failed"), ("test_b", "passed"), baseline=base))
    assert not v.passed and v.cause == Cause.test_failure and v.failing_tests == ["tests/test_calc.py::test_a"]
    assert v.baseline and "not used" in v.baseline and "timeout" in v.baseline, v.baseline
    # A rerun that passed the test but was not believed (no report) does not make it flaky.
    usable_base = BaselineEvidence(
        mode="compare",
        base_commit="d" * 40,
        base=facts("baseline", ("test_a", "passed")),
        reruns=[run_facts(ValidationEvidence(diff_nonempty=True, exit_code=0, report=None), "rerun 1", {"x"})],
    )
    assert not usable_base.reruns[0].usable
    v = grade(after_run(("test_a", "failed"), ("test_b", "passed"), baseline=usable_base))
    assert not v.passed and v.flaky == [] and v.failing_tests == ["tests/test_calc.py::test_a"]


def test_the_budget_covers_the_baseline_and_the_reruns() -> None:
    off = ValidationSpec(command=["pytest"], timeout_s=10)
    on = ValidationSpec(command=["pytest"], timeout_s=10, baseline="compare", flaky_reruns=3)
    assert validation_budget_s(off, None) == 10 and validation_budget_s(on, None) == 10 + 10 * 4
    with pytest.raises(ValueError, match="less than or equal to 5"):
        ValidationSpec(command=["pytest"], flaky_reruns=6)


# ---------------------------------------------------------------- end to end


@pytest.mark.postgres
@pytest.mark.temporal
async def test_pre_existing_fixed_regression_cache_and_tenants(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, repo: Path
) -> None:
    async with crew_on(tmp_path, temporal_server, pg_url, "bwrap") as crew:
        crew = await crew.with_new_tenant()
        # 1. The fix: test_add fixed, test_legacy failing at the base too: pre-existing, not blocking.
        fixed = await crew.result(await crew.submit(item(repo, FIXED)), timeout_s=300)
        # 2. Same base, another item that breaks mul: a regression, and the baseline comes from the cache.
        broke = await crew.result(await crew.submit(item(repo, BROKEN_MUL)), timeout_s=300)
        # 3. Another tenant, same repository and base: its own baseline, never the first tenant's.
        other = await crew.with_new_tenant()
        theirs = await other.result(await other.submit(item(repo, FIXED)), timeout_s=300)
        # 4. Today's behaviour without a baseline: the pre-existing failure fails the attempt.
        off = await crew.result(await crew.submit(item(repo, FIXED, baseline="off")), timeout_s=300)
        flaky_listed = await crew.store.list_flaky(crew.tenant_id, await repository_id(crew))

    v = fixed.attempts[0].validation
    assert fixed.state == "succeeded", v
    assert v.cause == "passed" and v.pre_existing == [LEGACY_ID] and v.fixed == [ADD], v
    assert [(r.label, r.cached, r.usable) for r in v.extra_runs] == [("baseline", False, True)], v.extra_runs
    assert v.extra_runs[0].log_ref is not None and "pre-existing" in v.reason

    b = broke.attempts[0].validation
    assert broke.state == "failed" and b.cause == "test_failure", b
    assert f"regressions (first: {MUL})" in b.reason and b.pre_existing == [LEGACY_ID] and b.flaky == [], b
    assert {t.id for t in b.tests if t.outcome == "failed"} == {MUL, LEGACY_ID}
    assert b.extra_runs[0].cached and b.extra_runs[0].cached_from, b.extra_runs
    # mul fails deterministically: both reruns ran, it never passed, so it stays a regression.
    assert [(r.label, r.usable) for r in b.extra_runs[1:]] == [("rerun 1", True), ("rerun 2", True)], b.extra_runs
    assert b.baseline and "(cached)" in b.baseline and "2 reruns" in b.baseline, b.baseline

    t = theirs.attempts[0].validation
    assert theirs.state == "succeeded" and t.pre_existing == [LEGACY_ID]
    assert t.extra_runs[0].label == "baseline" and not t.extra_runs[0].cached, "a baseline is never shared"

    o = off.attempts[0].validation
    assert off.state == "failed" and o.cause == "test_failure" and "1 test of 3 failed" in o.reason, o
    assert o.extra_runs == [] and o.baseline is None and o.pre_existing == []
    assert flaky_listed == []


@pytest.mark.postgres
@pytest.mark.temporal
async def test_a_baseline_cut_by_its_timeout_never_excuses_a_failure(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    # At the base, importing calc sleeps past the timeout: the baseline is cut and must not be used.
    slow = "import time\n\ntime.sleep(120)\n\n" + BUGGY
    repo = make_repo(
        tmp_path / "repo",
        {"calc.py": slow, "tests/test_calc.py": TESTS, "tests/test_legacy.py": LEGACY, "conftest.py": ""},
    )
    async with crew_on(tmp_path, temporal_server, pg_url, "bwrap") as crew:
        result = await crew.result(await crew.submit(item(repo, FIXED, timeout_s=15)), timeout_s=300)
    v = result.attempts[0].validation
    assert result.state == "failed" and v.cause == "test_failure" and "1 test of 3 failed" in v.reason, v
    assert v.pre_existing == [] and [(r.label, r.cause, r.usable) for r in v.extra_runs] == [
        ("baseline", "timeout", False)
    ]
    assert v.baseline and "not used" in v.baseline, v.baseline


FLAKY = """
import os

COUNTER = {counter!r}


def test_sometimes():
    seen = int(open(COUNTER).read()) if os.path.exists(COUNTER) else 0
    with open(COUNTER, "w") as f:
        f.write(str(seen + 1))
    assert seen > 0, "fails on its first run only"
"""


@pytest.mark.postgres
@pytest.mark.temporal
async def test_a_test_that_fails_then_passes_on_the_same_tree_is_flaky_and_listed(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, repo: Path
) -> None:
    counter = tmp_path / "outside-the-tree" / "counter"
    counter.parent.mkdir()
    files = {"calc.py": FIXED, "tests/test_flaky.py": FLAKY.format(counter=str(counter))}
    spec = code_change(repo, scripted({"files": files}), validation(), review={"required": False})
    async with crew_on(tmp_path, temporal_server, pg_url, "local", allow_unsafe_sandbox=True) as crew:
        wid = await crew.submit(spec)
        result = await crew.result(wid, timeout_s=300)
        rid = await repository_id(crew)
        listed = await crew.store.list_flaky(crew.tenant_id, rid)
        # Shown by the API to the tenant, and to no other tenant.
        _, key = await crew.store.create_api_key(str(await crew.store.tenant_name(crew.tenant_id)))
        _, stranger = await crew.store.create_api_key(f"stranger-{wid[-6:]}")
        async with ApiServer(crew.settings) as api, api.client(key) as c, api.client(stranger) as other:
            shown = await c.get(f"/v1/repositories/{rid}/flaky-tests")
            hidden = await other.get(f"/v1/repositories/{rid}/flaky-tests")
    v = result.attempts[0].validation
    assert result.state == "succeeded", v
    flaky_id = "tests/test_flaky.py::test_sometimes"
    assert v.flaky == [f"{flaky_id}: failed in the change's run; passed in rerun 1"], v.flaky
    assert v.pre_existing == [LEGACY_ID] and v.fixed == [ADD], v
    # One rerun was enough: the only candidate passed in it.
    assert [r.label for r in v.extra_runs] == ["baseline", "rerun 1"], v.extra_runs
    assert [(f.test_id, f.times, f.last_work_item_id) for f in listed] == [(flaky_id, 1, wid)]
    assert int(counter.read_text()) == 2
    assert shown.status_code == 200 and [f["test_id"] for f in shown.json()["items"]] == [flaky_id], shown.text
    assert hidden.status_code == 404, hidden.text
    line = _flaky_line(shown.json()["items"][0])
    assert line.startswith(f"{flaky_id}  x1  last {wid} attempt 1: ") and "passed in rerun 1" in line


def test_the_cli_shows_the_baseline_and_what_it_sorted() -> None:
    from crewwork.cli.render import flag_lines

    lines = flag_lines(
        {
            "baseline": "Baseline on base commit abc (cached): 3 tests ran, 1 failing.",
            "pre_existing": [LEGACY_ID],
            "flaky": [f"{ADD}: failed in the change's run; passed in rerun 1"],
            "fixed": [MUL],
        }
    )
    assert lines == [
        "    baseline: Baseline on base commit abc (cached): 3 tests ran, 1 failing.",
        f"    pre-existing (failing at the base too): {LEGACY_ID}",
        f"    flaky: {ADD}: failed in the change's run; passed in rerun 1",
        f"    fixed (failing at the base): {MUL}",
    ]
