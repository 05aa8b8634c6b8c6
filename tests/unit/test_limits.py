"""Repair-loop limits: each budget, the same-cause breaker, operator ceilings, and restart-safety."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import crewwork.models.limits as limits_module
from crewwork.models import BudgetSpec
from crewwork.models.limits import (
    AttemptBudget,
    CostBudget,
    LimitHit,
    Limits,
    LoopState,
    OperatorCeilings,
    SameCauseBreaker,
    TokenBudget,
    WallClockBudget,
    check_within_ceilings,
    trailing_same_cause,
)

A = "test_failure:aaaaaaaaaaaa"
B = "test_failure:bbbbbbbbbbbb"
T = "timeout:cccccccccccc"


def test_attempt_budget_stops_when_attempts_are_used() -> None:
    budget = AttemptBudget(3)
    assert budget.check(LoopState(attempts_made=2)) is None
    hit = budget.check(LoopState(attempts_made=3))
    assert hit == LimitHit("attempts", "attempt budget spent: 3 of 3 attempts used")


def test_wall_clock_budget_uses_the_time_it_is_given() -> None:
    budget = WallClockBudget(600)
    assert budget.check(LoopState(now_s=1_000, started_at_s=500)) is None
    hit = budget.check(LoopState(now_s=1_100, started_at_s=500))
    assert hit is not None and hit.kind == "wall_clock" and "600s elapsed of 600s" in hit.reason
    assert budget.check(LoopState(now_s=10**9, started_at_s=None)) is None  # nothing started yet


def test_token_and_cost_budgets() -> None:
    assert TokenBudget(1000).check(LoopState(tokens_used=999)) is None
    tokens = TokenBudget(1000).check(LoopState(tokens_used=1000))
    assert tokens is not None and tokens.kind == "tokens" and "1000 of 1000" in tokens.reason
    assert CostBudget(0.5).check(LoopState(cost_usd=0.49)) is None
    cost = CostBudget(0.5).check(LoopState(cost_usd=0.5))
    assert cost is not None and cost.kind == "cost" and "$0.5000 of $0.5000" in cost.reason


def test_breaker_trips_after_k_consecutive_same_fingerprints() -> None:
    breaker = SameCauseBreaker(k=3)
    assert breaker.check(LoopState(fingerprints=(A, A))) is None
    hit = breaker.check(LoopState(fingerprints=(B, A, A, A)))
    assert hit is not None and hit.kind == "breaker" and A in hit.reason and "last 3 attempts" in hit.reason


def test_breaker_needs_consecutive_failures() -> None:
    breaker = SameCauseBreaker(k=3)
    assert breaker.check(LoopState(fingerprints=(A, A, B, A))) is None
    assert breaker.check(LoopState(fingerprints=(A, T, A))) is None


def test_passed_attempts_never_feed_the_breaker() -> None:
    # Attempts sent back by a reviewer passed validation; they are not a run of failures.
    p = "passed:dddddddddddd"
    assert SameCauseBreaker(k=2).check(LoopState(fingerprints=(p, p, p))) is None
    assert SameCauseBreaker(k=2).check(LoopState(fingerprints=(None, None))) is None
    assert SameCauseBreaker(k=2).check(LoopState(fingerprints=(A, None, A))) is None


def test_breaker_k_is_configurable_and_validated() -> None:
    assert SameCauseBreaker(k=1).check(LoopState(fingerprints=(A,))) is not None
    with pytest.raises(ValueError, match="at least 1"):
        SameCauseBreaker(k=0)
    assert trailing_same_cause((B, A, A)) == 2
    assert trailing_same_cause(()) == 0


def test_breaker_counts_from_persisted_history_so_a_restart_gives_the_same_decision() -> None:
    """Two failures before a restart and one after trip it, exactly as three in one run would."""
    history: list[str | None] = [A, A]  # persisted attempt rows, before the worker died
    before = Limits.from_spec(BudgetSpec(max_attempts=10)).check(
        LoopState(attempts_made=2, fingerprints=tuple(history))
    )
    assert before is None
    history.append(A)  # the first attempt after the restart fails the same way
    # A new workflow run (or a replay) rebuilds the limits and state from the same history.
    rebuilt = Limits.from_spec(BudgetSpec(max_attempts=10))
    state = LoopState(attempts_made=len(history), fingerprints=tuple(history))
    hit = rebuilt.check(state)
    assert hit is not None and hit.kind == "breaker"
    assert rebuilt.check(state) == Limits.from_spec(BudgetSpec(max_attempts=10)).check(state)


def test_limits_from_spec_checks_every_budget_with_the_breaker_first() -> None:
    spec = BudgetSpec(max_attempts=5, max_wall_clock_s=60, max_tokens=100, max_cost_usd=1.0)
    limits = Limits.from_spec(spec)
    assert limits.check(LoopState(attempts_made=1, now_s=10, started_at_s=0)) is None
    state = LoopState(attempts_made=5, now_s=100, started_at_s=0, tokens_used=100, cost_usd=2.0, fingerprints=(A, A, A))
    assert [h.kind for h in limits.check_all(state)] == [
        "breaker",
        "attempts",
        "wall_clock",
        "tokens",
        "cost",
    ]
    first = limits.check(state)
    assert first is not None and first.kind == "breaker"
    for kind, s in [
        ("attempts", LoopState(attempts_made=5)),
        ("wall_clock", LoopState(now_s=61, started_at_s=0)),
        ("tokens", LoopState(tokens_used=101)),
        ("cost", LoopState(cost_usd=1.01)),
    ]:
        hit = limits.check(s)
        assert hit is not None and hit.kind == kind


def test_unset_budgets_are_not_checked_unless_the_operator_sets_a_ceiling() -> None:
    free = Limits.from_spec(BudgetSpec(max_attempts=3))
    assert free.check(LoopState(attempts_made=1, now_s=10**9, started_at_s=0, tokens_used=10**9, cost_usd=1e9)) is None
    capped = Limits.from_spec(BudgetSpec(max_attempts=3), OperatorCeilings(max_tokens=1000, max_wall_clock_s=60))
    hit = capped.check(LoopState(attempts_made=1, tokens_used=5000))
    assert hit is not None and hit.kind == "tokens"
    hit = capped.check(LoopState(attempts_made=1, now_s=61, started_at_s=0))
    assert hit is not None and hit.kind == "wall_clock"


def test_effective_limits_are_the_tighter_of_spec_and_ceiling() -> None:
    limits = Limits.from_spec(
        BudgetSpec(max_attempts=2, max_tokens=50), OperatorCeilings(max_attempts=10, max_tokens=500)
    )
    assert AttemptBudget(2) in limits.limits and TokenBudget(50) in limits.limits


def test_submission_over_a_ceiling_is_rejected_with_a_clear_message() -> None:
    ceilings = OperatorCeilings(max_attempts=10, max_wall_clock_s=3600, max_tokens=1_000_000, max_cost_usd=5)
    check_within_ceilings(BudgetSpec(max_attempts=10, max_cost_usd=5), ceilings)  # at the ceiling is fine
    with pytest.raises(ValueError) as err:
        check_within_ceilings(BudgetSpec(max_attempts=50, max_cost_usd=20), ceilings)
    message = str(err.value)
    assert "budget.max_attempts is 50 but this deployment allows at most 10" in message
    assert "budget.max_cost_usd is 20 but this deployment allows at most 5" in message
    check_within_ceilings(BudgetSpec(max_attempts=1000), OperatorCeilings())  # no ceilings, anything goes


def test_limits_module_is_safe_for_the_workflow_sandbox() -> None:
    """Only stdlib and crewwork.models imports, and no clock, randomness or I/O."""
    tree = ast.parse(Path(limits_module.__file__).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module if node.module.startswith("crewwork") else node.module.split(".")[0])
    # No time, datetime, random, os or io can be reached without importing them.
    assert imported <= {
        "__future__",
        "math",
        "collections",
        "dataclasses",
        "typing",
        "crewwork.models",
        "crewwork.models.spec",
    }
    assert "open" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
