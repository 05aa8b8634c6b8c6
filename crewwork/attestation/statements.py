"""Facts -> in-toto Statements v1 (plain JSON values), each checked against the in-toto attestation schemas
(`in-toto-attestation`'s Statement, SLSA Provenance v1 and Test Result protos) before it is signed.

| statement | predicate type | subjects |
|---|---|---|
| provenance | SLSA Provenance v1 | `git:commit`, `git:tree`, the landed diff (one attempt's bundle: its diff) |
| test result | in-toto Test Result v0.1 | `git:tree` (landed), the diff, the JUnit report, probe transcripts, the outcome witness's streams, `sandbox.json`, `environment.json` |
| review | crewwork review v1 | `git:tree` (landed), the diff |

The statements are built as JSON values, not serialised from the protos: protobuf's Struct would turn every number of
the submission into a float. The protos only check the shape (unknown fields are errors).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from crewwork.attestation.facts import Facts, FileFact
from crewwork.attestation.format import (
    BUILD_TYPE,
    COMMIT_SUBJECT,
    PROVENANCE,
    REVIEW,
    SCOPE_ATTEMPT,
    SCOPE_LANDED,
    STATEMENT_TYPE,
    TEST_RESULT,
    TREE_SUBJECT,
)

FORMAT_VERSION = 1


def rfc3339(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(epoch_s)))


def file_descriptor(f: FileFact) -> dict[str, Any]:
    return {"name": f.name, "digest": {"sha256": hashlib.sha256(f.data).hexdigest()}, "mediaType": f.media_type}


def git_subjects(facts: Facts) -> list[dict[str, Any]]:
    landed = facts.landed
    if landed is None:
        return []
    return [
        {"name": COMMIT_SUBJECT, "digest": {"gitCommit": landed.commit}},
        {"name": TREE_SUBJECT, "digest": {"gitTree": landed.tree, "sha256": landed.tree_sha256}},
    ]


def statement(subjects: list[dict[str, Any]], predicate_type: str, predicate: dict[str, Any]) -> dict[str, Any]:
    stmt = {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": predicate_type, "predicate": predicate}
    check_statement(stmt)
    return stmt


def scope(facts: Facts) -> str:
    return SCOPE_LANDED if facts.landed is not None else SCOPE_ATTEMPT


def provenance_statement(facts: Facts, builder_id: str, version: str) -> dict[str, Any]:
    landed = facts.landed
    internal: dict[str, Any] = {
        "scope": scope(facts),
        "formatVersion": FORMAT_VERSION,
        "tenant": facts.tenant_id,
        "attempt": facts.attempt,
        "agent": facts.agent,
        "mock": facts.mock,
    }
    if facts.mock:
        internal["mockNotice"] = (
            f"the change was made by the {facts.agent.get('name')!r} agent, a mock: its output is scripted, not "
            "produced by a model or a person"
        )
    if landed is not None:
        internal["deliveryBranch"] = landed.branch
    predicate = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "workItem": {"id": facts.work_item_id, "kind": facts.kind, "submission": facts.submission},
            },
            "internalParameters": internal,
            "resolvedDependencies": [
                {
                    "name": "base",
                    "uri": f"{facts.repo}@{facts.ref}" if facts.ref else facts.repo,
                    "digest": {"gitCommit": facts.base_commit},
                },
                file_descriptor(facts.environment),
            ],
        },
        "runDetails": {
            "builder": {"id": builder_id, "version": {"crewwork": version}},
            "metadata": {
                "invocationId": facts.workflow_id,
                "startedOn": rfc3339(facts.created_at),
                "finishedOn": rfc3339(landed.committed_at if landed is not None else facts.attempt_finished_at),
            },
            "byproducts": [
                {
                    "name": "attempts",
                    "annotations": {
                        "attempts": [
                            {"number": a.number, "verdict": a.verdict, "cause": a.cause} for a in facts.attempts
                        ]
                    },
                }
            ],
        },
    }
    subjects = [*git_subjects(facts), file_descriptor(facts.diff)]
    return statement(subjects, PROVENANCE, predicate)


TEST_IDS_MAX_CHARS = 4 * 1024 * 1024
"""Characters of test ids one Test Result lists, failed ones first, then passed, then skipped. The ids come from the
report, which the code under test writes: unbounded, 50,000 ids of 1,000 characters would make a bundle no store
keeps and no verifier reads. The `test-counts` descriptor says how many of each there were; the report, a subject,
names them all."""
TEST_IDS_MAX_COUNT = 200_000
"""Test ids one Test Result lists, whatever their length: a verifier reads at most MAX_JSON_VALUES values per
statement (crewwork.attestation.format), and a million one-character ids fit in TEST_IDS_MAX_CHARS."""
TEST_COUNTS = "test-counts"


def listed_tests(facts: Facts) -> tuple[list[str], list[str], list[str], dict[str, Any]]:
    """(passed, failed, skipped) ids within TEST_IDS_MAX_CHARS, and the counts annotation."""
    by = {
        "failed": sorted(t.id for t in facts.tests if t.outcome in ("failed", "error")),
        "passed": sorted(t.id for t in facts.tests if t.outcome == "passed"),
        "skipped": sorted(t.id for t in facts.tests if t.outcome == "skipped"),
    }
    left, left_ids = TEST_IDS_MAX_CHARS, TEST_IDS_MAX_COUNT
    listed: dict[str, list[str]] = {}
    for outcome in ("failed", "passed", "skipped"):
        keep: list[str] = []
        for test_id in by[outcome]:
            if len(test_id) > left or left_ids == 0:
                break
            keep.append(test_id)
            left -= len(test_id)
            left_ids -= 1
        listed[outcome] = keep
    c = facts.test_counts
    if c is not None:
        total = {"passed": c.get("passed", 0), "failed": c.get("failed", 0) + c.get("error", 0)}
        total["skipped"] = c.get("skipped", 0)
    else:
        total = {k: len(v) for k, v in by.items()}
    counts: dict[str, Any] = {
        **total,
        "executed": facts.tests_executed,
        "complete": all(len(listed[k]) == total[k] for k in total),
    }
    return listed["passed"], listed["failed"], listed["skipped"], counts


def validation_statement(facts: Facts, url: str) -> dict[str, Any]:
    passed, failed, warned, counts = listed_tests(facts)
    predicate = {
        "result": "PASSED" if facts.passed else "FAILED",
        "configuration": [file_descriptor(facts.validation), {"name": TEST_COUNTS, "annotations": counts}],
        "url": url,
        "passedTests": passed,
        "warnedTests": warned,
        "failedTests": failed,
    }
    subjects = [*git_subjects(facts)[1:], file_descriptor(facts.diff)]
    if facts.report is not None:
        subjects.append(file_descriptor(facts.report))
    subjects += [file_descriptor(t) for t in facts.transcripts]
    subjects += [file_descriptor(facts.sandbox), file_descriptor(facts.environment)]
    return statement(subjects, TEST_RESULT, predicate)


def review_statement(facts: Facts) -> dict[str, Any]:
    r = facts.review
    predicate: dict[str, Any] = {"workItem": facts.work_item_id, "attempt": facts.attempt, "mock": facts.mock}
    if r is None or not r.required:
        predicate.update(
            required=False,
            decision="none",
            note="the work item did not ask for review: nobody approved this change before it landed",
        )
    else:
        predicate.update(
            required=True,
            decision=r.decision,
            reviewer=r.reviewer,
            apiKey=r.api_key_id,
            comment=r.comment,
            decidedAt=rfc3339(r.decided_at) if r.decided_at is not None else None,
        )
        if r.diff_sha256:
            predicate["diffSha256"] = r.diff_sha256
        if r.line_comments:
            predicate["lineComments"] = list(r.line_comments)
        if r.history:
            predicate["history"] = list(r.history)
    subjects = [*git_subjects(facts)[1:], file_descriptor(facts.diff)]
    return statement(subjects, REVIEW, predicate)


def statements(facts: Facts, *, builder_id: str, version: str, url: str) -> list[dict[str, Any]]:
    """The bundle's statements: provenance and test result, and for a landed change the review."""
    out = [provenance_statement(facts, builder_id, version), validation_statement(facts, url)]
    if facts.landed is not None:
        out.append(review_statement(facts))
    return out


# ------------------------------------------------------------------------------------------------ schema checks


class StatementError(ValueError):
    """A statement does not have the shape its type requires; the message says where."""


def check_statement(stmt: dict[str, Any]) -> None:
    """The in-toto attestation library's checks: Statement v1 (type, subjects with digests, a predicate), and for
    SLSA Provenance v1 and Test Result the predicate's fields (unknown fields are errors)."""
    from google.protobuf import json_format
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.statement import Statement

    try:
        pb = json_format.ParseDict(stmt, statement_pb2.Statement())  # type: ignore[attr-defined]
        Statement.copy_from_pb(pb).validate()
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise StatementError(f"not an in-toto Statement v1: {exc}") from None
    ptype = stmt.get("predicateType")
    if ptype in (PROVENANCE, TEST_RESULT):
        from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
        from in_toto_attestation.predicates.test_result.v0 import test_result_pb2

        proto = provenance_pb2.Provenance() if ptype == PROVENANCE else test_result_pb2.TestResult()  # type: ignore[attr-defined]
        try:
            json_format.ParseDict(stmt["predicate"], proto)
        except (json_format.ParseError, ValueError, TypeError) as exc:
            raise StatementError(f"not a valid {ptype} predicate: {exc}") from None
