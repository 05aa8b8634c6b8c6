"""Fencing in Temporal's scheduling order: every write to a work item is ranked by when Temporal scheduled it, and
the store accepts it only while nothing ranked higher has been (the rule: rule.py's docstring).

    rule.py         the rule, and `FencingStore`, the store's fenced writes, which runs each through one path:
    reference.py    the fenced write statement by statement: the reference implementation of the rules
    dialects.py     SQLite and PostgreSQL as subclasses of it
    server_side.py  PostgreSQL as one call of `crewwork_fenced_write` (migration 0008), proven equal by
                    tests/store/test_fencing_differential.py
    vocabulary.py   ranks, the values a write is made of (`FencedWrite`, `StateChange`, `AttemptRecord`), results
    sql.py          the statements, built once
"""

from crewwork.store.fencing.reference import PythonWrites
from crewwork.store.fencing.rule import REVIEW_EVENT, REVIEW_WEBHOOK, FencingStore
from crewwork.store.fencing.vocabulary import (
    IN_FLIGHT_STATES,
    SUBMISSION,
    Accepted,
    Admission,
    AttemptRecord,
    FencedWrite,
    HandedOff,
    Rank,
    StateChange,
    WriteResult,
)

__all__ = [
    "IN_FLIGHT_STATES",
    "REVIEW_EVENT",
    "REVIEW_WEBHOOK",
    "SUBMISSION",
    "Accepted",
    "Admission",
    "AttemptRecord",
    "FencedWrite",
    "FencingStore",
    "HandedOff",
    "PythonWrites",
    "Rank",
    "StateChange",
    "WriteResult",
]
