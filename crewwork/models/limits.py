"""Repair-loop limits: budgets and the same-cause breaker, small composable objects that explain themselves.

Each limit answers one question, ``check(state) -> LimitHit | None``, from a `LoopState` it is handed: how
many attempts were made, when the loop started and what time it is now, tokens and cost spent, and the
fingerprints of past attempts in order. The state is built from the persisted attempt history, so the decision
after a worker or workflow restart is the same as before it.

This module is imported by workflow code, so it must stay deterministic: no I/O, no clock reads (the current
time is passed in, from ``workflow.now()``), no randomness, and only stdlib and ``crewwork.models`` imports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from crewwork.models.spec import BudgetSpec

DEFAULT_BREAKER_K = 3

# A fingerprint with this prefix belongs to an attempt that passed validation (it was sent back by a
# reviewer); it is not a failure and so never feeds the breaker. Mirrors `Cause.passed` in
# crewwork.validation.grading, which this module may not import (workflow sandbox).
PASSED_FINGERPRINT_PREFIX = "passed:"


@dataclass(frozen=True)
class LimitHit:
    """A limit that says stop, and why, in words fit for the work item's final reason."""

    kind: str
    """One of ``attempts``, ``wall_clock``, ``tokens``, ``cost``, ``breaker``."""
    reason: str


@dataclass(frozen=True)
class LoopState:
    """What limits look at before the next attempt; all of it from persisted history or passed in."""

    attempts_made: int = 0
    """Attempts already made (finished or abandoned), not counting the one about to start."""
    now_s: float = 0.0
    """Current time in seconds (``workflow.now().timestamp()`` in a workflow; never read here)."""
    started_at_s: float | None = None
    """When the first attempt started, in the same clock as `now_s`; None if none has started."""
    tokens_used: int = 0
    """Model tokens spent across all attempts."""
    cost_usd: float = 0.0
    """Model cost spent across all attempts, in US dollars."""
    fingerprints: tuple[str | None, ...] = field(default_factory=tuple)
    """Failure fingerprint of each past attempt, oldest first; None for an attempt without a failure."""

    @property
    def elapsed_s(self) -> float:
        return 0.0 if self.started_at_s is None else max(self.now_s - self.started_at_s, 0.0)


class Limit(Protocol):
    def check(self, state: LoopState) -> LimitHit | None: ...


@dataclass(frozen=True)
class AttemptBudget:
    """At most `max_attempts` attempts."""

    max_attempts: int

    def check(self, state: LoopState) -> LimitHit | None:
        if state.attempts_made >= self.max_attempts:
            return LimitHit(
                "attempts",
                f"attempt budget spent: {state.attempts_made} of {self.max_attempts} attempts used",
            )
        return None


@dataclass(frozen=True)
class WallClockBudget:
    """No new attempt once `max_s` seconds have passed since the first attempt started."""

    max_s: float

    def check(self, state: LoopState) -> LimitHit | None:
        if state.elapsed_s >= self.max_s:
            return LimitHit(
                "wall_clock",
                f"wall-clock budget spent: {state.elapsed_s:.0f}s elapsed of {self.max_s:g}s allowed",
            )
        return None


@dataclass(frozen=True)
class TokenBudget:
    """No new attempt once `max_tokens` model tokens have been spent."""

    max_tokens: int

    def check(self, state: LoopState) -> LimitHit | None:
        if state.tokens_used >= self.max_tokens:
            return LimitHit(
                "tokens",
                f"token budget spent: {state.tokens_used} of {self.max_tokens} model tokens used",
            )
        return None


@dataclass(frozen=True)
class CostBudget:
    """No new attempt once `max_usd` of model cost has been spent."""

    max_usd: float

    def check(self, state: LoopState) -> LimitHit | None:
        if state.cost_usd >= self.max_usd:
            return LimitHit(
                "cost",
                f"cost budget spent: ${state.cost_usd:.4f} of ${self.max_usd:.4f} used",
            )
        return None


def _is_failure(fp: str | None) -> bool:
    return bool(fp) and not (fp or "").startswith(PASSED_FINGERPRINT_PREFIX)


def trailing_same_cause(fingerprints: Sequence[str | None]) -> int:
    """How many of the most recent attempts, consecutively, failed with the last attempt's fingerprint."""
    if not fingerprints or not _is_failure(fingerprints[-1]):
        return 0
    last = fingerprints[-1]
    run = 0
    for fp in reversed(fingerprints):
        if fp != last:
            break
        run += 1
    return run


@dataclass(frozen=True)
class SameCauseBreaker:
    """Stop when the last `k` consecutive attempts failed with the same fingerprint.

    Counted from the persisted history of fingerprints, never from an in-memory counter, so a restart in the
    middle of a run of same-cause failures neither resets nor double-counts it.
    """

    k: int = DEFAULT_BREAKER_K

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"breaker k must be at least 1, got {self.k}")

    def check(self, state: LoopState) -> LimitHit | None:
        run = trailing_same_cause(state.fingerprints)
        if run >= self.k:
            return LimitHit(
                "breaker",
                f"breaker: the last {run} attempts failed the same way ({state.fingerprints[-1]})",
            )
        return None


@dataclass(frozen=True)
class OperatorCeilings:
    """Operator-set maxima that no submission may exceed; None means no ceiling for that budget."""

    max_attempts: int | None = None
    """Most attempts any work item may ask for."""
    max_wall_clock_s: float | None = None
    """Most wall-clock seconds of attempts; also the limit for submissions that set none."""
    max_tokens: int | None = None
    """Most model tokens; also the limit for submissions that set none."""
    max_cost_usd: float | None = None
    """Most model cost in US dollars; also the limit for submissions that set none."""


def ceiling_violations(spec: BudgetSpec, ceilings: OperatorCeilings) -> list[tuple[str, str]]:
    """(field, message) for every budget field that asks for more than the operator allows."""
    problems: list[tuple[str, str]] = []
    pairs: tuple[tuple[str, float | None, float | None], ...] = (
        ("max_attempts", spec.max_attempts, ceilings.max_attempts),
        ("max_wall_clock_s", spec.max_wall_clock_s, ceilings.max_wall_clock_s),
        ("max_tokens", spec.max_tokens, ceilings.max_tokens),
        ("max_cost_usd", spec.max_cost_usd, ceilings.max_cost_usd),
    )
    for name, asked, ceiling in pairs:
        if asked is not None and ceiling is not None and asked > ceiling:
            problems.append(
                (f"budget.{name}", f"budget.{name} is {asked:g} but this deployment allows at most {ceiling:g}")
            )
    return problems


def check_within_ceilings(spec: BudgetSpec, ceilings: OperatorCeilings) -> None:
    """Reject (ValueError) a submitted budget that asks for more than the operator allows."""
    problems = ceiling_violations(spec, ceilings)
    if problems:
        raise ValueError("; ".join(msg for _field, msg in problems))


def effective_budget(spec: BudgetSpec, ceilings: OperatorCeilings) -> BudgetSpec:
    """The budget a work item runs under: what it asked for, capped by the ceilings, which also apply where it asked
    for nothing (an item that set no token budget gets the operator's)."""
    attempts = _tighter(spec.max_attempts, ceilings.max_attempts)
    tokens = _tighter(spec.max_tokens, ceilings.max_tokens)
    return BudgetSpec(
        max_attempts=int(attempts if attempts is not None else spec.max_attempts),
        max_wall_clock_s=_tighter(spec.max_wall_clock_s, ceilings.max_wall_clock_s),
        max_tokens=int(tokens) if tokens is not None else None,
        max_cost_usd=_tighter(spec.max_cost_usd, ceilings.max_cost_usd),
    )


def _tighter(asked: float | None, ceiling: float | None) -> float | None:
    if asked is None:
        return ceiling
    if ceiling is None:
        return asked
    return min(asked, ceiling)


@dataclass(frozen=True)
class Limits:
    """All the limits of one work item. The first that says stop wins; the breaker goes first, being the most
    specific."""

    limits: tuple[Limit, ...]

    @classmethod
    def from_spec(
        cls,
        spec: BudgetSpec,
        ceilings: OperatorCeilings | None = None,
        *,
        breaker_k: int = DEFAULT_BREAKER_K,
    ) -> Limits:
        """The effective limits: the submission's budget, capped by the operator's ceilings (which also apply
        where the submission set nothing)."""
        ceilings = ceilings or OperatorCeilings()
        items: list[Limit] = [SameCauseBreaker(breaker_k)]
        attempts = _tighter(spec.max_attempts, ceilings.max_attempts)
        items.append(AttemptBudget(int(attempts if attempts is not None else spec.max_attempts)))
        wall = _tighter(spec.max_wall_clock_s, ceilings.max_wall_clock_s)
        if wall is not None:
            items.append(WallClockBudget(wall))
        tokens = _tighter(spec.max_tokens, ceilings.max_tokens)
        if tokens is not None:
            items.append(TokenBudget(int(tokens)))
        cost = _tighter(spec.max_cost_usd, ceilings.max_cost_usd)
        if cost is not None and math.isfinite(cost):
            items.append(CostBudget(cost))
        return cls(tuple(items))

    def check(self, state: LoopState) -> LimitHit | None:
        """The first limit that says stop, or None to go ahead with the next attempt."""
        for limit in self.limits:
            hit = limit.check(state)
            if hit is not None:
                return hit
        return None

    def check_all(self, state: LoopState) -> list[LimitHit]:
        """Every limit that says stop (for status pages; the loop only needs `check`)."""
        return [hit for limit in self.limits if (hit := limit.check(state)) is not None]
