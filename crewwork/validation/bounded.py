"""Bounded evidence: how a list, a log or a report the grading reads stays within its bound without a bound ever
turning into a pass.

A bound keeps memory, Temporal payloads and answers small; what it drops is missing evidence, and missing evidence is
never a pass. Two small values carry that through to grading, for the test reports today and for any check that
yields many results (SARIF, lint, scanner output):

- `Cut` (`crewwork.models.EvidenceCut`): what one bound dropped (which bound and its value, how much was seen and
  kept), and whether the dropped part **could decide the verdict** (`decisive`). The producer says so, because it
  knows what decides: a report too large to read is decisive, passing test cases dropped beyond a sample (their
  count kept exact) are not.
- `Sample`: a bounded list that keeps what decides. Items of a deciding kind (failures, errors) are kept up to
  their own bound, the rest are sampled (the first ones) up to theirs, items named as must-keep (a work item's
  listed tests) are always kept, and the counts per kind are exact over everything seen. Its `cuts()` say what was
  dropped; dropping a deciding item (past its own, larger bound) is reported decisive unless the caller knows the
  kept ones already decide.

The grading function has one rule for all of it (crewwork.validation.grading, `not_judged`): evidence with a
decisive cut is not judged, which fails, and the verdict's `cuts` say what was cut and why.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from crewwork.models import EvidenceCut

Cut = EvidenceCut
T = TypeVar("T")


def decisive(cuts: Iterable[Cut]) -> list[Cut]:
    """The cuts among `cuts` that could decide a verdict."""
    return [c for c in cuts if c.decisive]


@dataclass
class Sample(Generic[T]):
    """A bounded list keyed by id: deciding kinds kept up to `keep_deciding`, the rest up to `keep_rest`, `must_keep`
    ids always; exact counts per kind. `merge(old, new)` decides what one id seen twice becomes."""

    what: str
    """What the items are, for cuts (`test cases`)."""
    deciding: frozenset[str]
    keep_deciding: int
    deciding_bound: str
    keep_rest: int
    rest_bound: str
    merge: Callable[[T, T], T]
    kind_of: Callable[[T], str]
    must_keep: frozenset[Hashable] = frozenset()
    deciding_drop_decides: bool = False
    """Whether a dropped deciding item could change the verdict given everything counted (test failures beyond
    their bound cannot: the exact count already fails the attempt, and listed tests are always kept)."""
    items: dict[Hashable, T] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    _kept_deciding: int = 0
    _kept_rest: int = 0

    def add(self, key: Hashable, item: T) -> bool:
        """Count `item` and keep it if the bounds allow; True when kept (or merged into a kept one)."""
        kind = self.kind_of(item)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        prior = self.items.get(key)
        if prior is not None:
            merged = self.merge(prior, item)
            if self.kind_of(merged) in self.deciding and self.kind_of(prior) not in self.deciding:
                self._kept_deciding += 1
                self._kept_rest -= 1
            self.items[key] = merged
            return True
        if key not in self.must_keep:
            if kind in self.deciding:
                if self._kept_deciding >= self.keep_deciding:
                    self.dropped[kind] = self.dropped.get(kind, 0) + 1
                    return False
            elif self._kept_rest >= self.keep_rest:
                self.dropped[kind] = self.dropped.get(kind, 0) + 1
                return False
        if kind in self.deciding:
            self._kept_deciding += 1
        else:
            self._kept_rest += 1
        self.items[key] = item
        return True

    def cuts(self) -> list[Cut]:
        out: list[Cut] = []
        lost_deciding = sum(n for k, n in self.dropped.items() if k in self.deciding)
        lost_rest = sum(n for k, n in self.dropped.items() if k not in self.deciding)
        if lost_deciding:
            seen = sum(n for k, n in self.counts.items() if k in self.deciding)
            out.append(
                Cut(
                    what=f"{self.what} ({'/'.join(sorted(self.deciding))})",
                    bound=self.deciding_bound,
                    limit=self.keep_deciding,
                    seen=seen,
                    kept=seen - lost_deciding,
                    decisive=self.deciding_drop_decides,
                    why="each is counted; past the bound only their ids and messages are not kept"
                    if not self.deciding_drop_decides
                    else "the dropped ones could decide the verdict",
                )
            )
        if lost_rest:
            seen = sum(n for k, n in self.counts.items() if k not in self.deciding)
            out.append(
                Cut(
                    what=f"{self.what} (other outcomes)",
                    bound=self.rest_bound,
                    limit=self.keep_rest,
                    seen=seen,
                    kept=seen - lost_rest,
                    decisive=False,
                    why="each is counted, and every listed one is kept: they cannot decide the verdict",
                )
            )
        return out
