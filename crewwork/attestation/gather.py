"""The store's record of a work item -> Facts (server side: control pools only).

Everything a bundle states is read from what the platform recorded: the item's submission, its attempts (the
agent's outcome without its claims, the validation's measured outcome and sandbox), the `environment_prepared`
event of the attempt, and the artifacts (diff, JUnit report). Nothing is asked of the agent or the workspace."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from crewwork.attestation.canonical import canonical
from crewwork.attestation.facts import AttemptFact, Facts, FileFact, LandedFact, ReviewFact, TestFact
from crewwork.attestation.format import ENVIRONMENT_FILE, FILE_NAME, LANDED_DIFF, SANDBOX_FILE, VALIDATION_FILE
from crewwork.boundary.masking import mask_secrets
from crewwork.models import AgentOutcome, ValidationOutcome
from crewwork.validation.parsers import parse_report

if TYPE_CHECKING:
    from crewwork.store.store import Store


class NothingToSign(LookupError):
    """The item or attempt has no evidence to sign (not in the store, no diff, never validated); says which."""


def sandbox_record(v: ValidationOutcome) -> dict[str, Any]:
    sb = v.sandbox
    if sb is None:
        return {"recorded": False, "note": "the validation never started a sandbox"}
    spec = sb.spec or {}
    return {
        "backend": sb.backend,
        "isolated": sb.isolated,
        "enforcement": sb.enforcement,
        "workspace_disk": sb.workspace_disk,
        "runner": spec.get("runner"),
        "limits": spec.get("limits"),
        "network": spec.get("network", "none"),
        "mounts": spec.get("mounts"),
        "spec_recorded": sb.spec is not None,
        "run": {
            "exit_code": sb.exit_code,
            "duration_s": sb.duration_s,
            "timed_out": sb.timed_out,
            "oom_killed": sb.oom_killed,
            "pids_limited": sb.pids_limited,
            "disk_limited": sb.disk_limited,
            "peak_memory_bytes": sb.peak_memory_bytes,
        },
    }


def environment_record(spec: dict[str, Any], prepared: dict[str, Any] | None) -> dict[str, Any]:
    env = spec.get("environment") or {}
    record: dict[str, Any] = {
        "prepared": prepared is not None,
        "python": env.get("python"),
        "image": env.get("image"),
        "setup": [*(env.get("setup") or []), *((spec.get("validation") or {}).get("setup") or [])],
        "network": bool(env.get("network")),
    }
    if prepared is not None:
        record.update(
            key=prepared.get("key"),
            venv=prepared.get("venv"),
            built_at=prepared.get("built_at"),
            network_decisions=prepared.get("network") or [],
        )
    return record


def validation_record(spec: dict[str, Any], v: ValidationOutcome) -> dict[str, Any]:
    val = spec.get("validation") or {}
    return {
        "command": val.get("command"),
        "junit_path": val.get("junit_path"),
        "timeout_s": val.get("timeout_s"),
        "fail_to_pass": val.get("fail_to_pass") or [],
        "pass_to_pass": val.get("pass_to_pass") or [],
        "test_files": val.get("test_files") or [],
        "protected_reset": [r.model_dump() for r in v.protected_reset],
        "protect": {k: (val.get("protect") or {}).get(k) for k in ("witness", "runner_code")},
        "verdict": {"passed": v.passed, "cause": v.cause, "reason": v.reason, "exit_code": v.exit_code},
        "doubts": list(v.doubts),
        "runner_reach": list(v.runner_reach),
        "unlisted_failing": list(v.unlisted_failing),
        "weakened": list(v.weakened),
        "baseline": {"mode": val.get("baseline") or "off", "note": v.baseline},
        "pre_existing": list(v.pre_existing),
        "flaky": list(v.flaky),
        "fixed": list(v.fixed),
        "extra_runs": [r.model_dump(mode="json") for r in v.extra_runs],
        "tests_executed": v.tests_executed,
        **({"preview": preview_record(val, v)} if val.get("preview") or v.preview else {}),
        **({"scanners": scan_record(val, v)} if val.get("scanners") is not None or v.scan else {}),
        **({"checks": check_records(val, v)} if val.get("checks") or v.checks else {}),
    }


def check_records(val: dict[str, Any], v: ValidationOutcome) -> list[dict[str, Any]]:
    """Each declared check with its result (its log's and report's digests: the reports are subjects too)."""
    declared = {c.get("name"): c for c in val.get("checks") or []}
    out = []
    for c in v.checks:
        record = c.model_dump(mode="json", exclude={"log_ref", "report_ref"})
        record["declared"] = declared.get(c.name)
        record["log_sha256"] = c.log_ref.sha256 if c.log_ref is not None else None
        record["report_sha256"] = c.report_ref.sha256 if c.report_ref is not None else None
        out.append(record)
    return out


def scan_record(val: dict[str, Any], v: ValidationOutcome) -> dict[str, Any]:
    """The declared scanners, what they found that the change introduces, and the digest of their SARIF log."""
    s = v.scan
    return {
        "declared": val.get("scanners"),
        "findings": [] if s is None else [f.model_dump() for f in s.findings],
        "total": 0 if s is None else s.total,
        "preexisting": 0 if s is None else s.preexisting,
        "errors": [] if s is None else list(s.errors),
        "sarif_sha256": v.scan_ref.sha256 if v.scan_ref is not None else None,
    }


def preview_record(val: dict[str, Any], v: ValidationOutcome) -> dict[str, Any]:
    """The declared preview and what it came to (its probes' evidence files are subjects of their own)."""
    p = v.preview
    return {
        "declared": val.get("preview"),
        "verdict": None if p is None else {"passed": p.passed, "cause": p.cause, "reason": p.reason},
        "command": None if p is None else p.command,
        "detected": None if p is None else p.detected,
        "backend": None if p is None else p.backend,
    }


async def probe_files(store: Store, v: ValidationOutcome) -> list[FileFact]:
    """Each probe's transcript and the preview's whole evidence record, what the outcome witness recorded, and the
    reports of the baseline and the reruns run for this attempt (validation.baseline), the security scanners' SARIF
    log and each named check's report (validation.checks), as subjects of the test result."""
    refs = [p.transcript_ref for p in v.preview.probes] + [v.preview.evidence_ref] if v.preview is not None else []
    refs.append(v.witness_ref)
    refs += [r.report_ref for r in v.extra_runs]
    refs.append(v.scan_ref)
    refs += [c.report_ref for c in v.checks]
    out = []
    for ref in refs:
        if ref is None or not FILE_NAME.match(ref.name):
            continue
        data = await store.artifact_content(ref.id)
        if data is not None:
            out.append(FileFact(ref.name, data, ref.content_type, ref.id))
    return out


async def gather(
    store: Store,
    work_item_id: str,
    attempt: int,
    *,
    landed: LandedFact | None = None,
    review: ReviewFact | None = None,
) -> Facts:
    """The facts of attempt `attempt` of the item: of its landed change when `landed` is given (then the diff is
    named `landed.patch`), else of that attempt alone."""
    row = await store.get_work_item(work_item_id)
    if row is None:
        raise NothingToSign(f"work item {work_item_id} is not in the store")
    if not row.repo_url or not row.base_commit:
        raise NothingToSign(f"work item {work_item_id} is a {row.kind}: it has no repository change to sign")
    attempts = await store.list_attempts(work_item_id)
    this = next((a for a in attempts if a.number == attempt), None)
    if this is None:
        raise NothingToSign(f"work item {work_item_id} has no attempt {attempt}")
    agent = AgentOutcome.model_validate(this.agent) if this.agent else None
    if agent is None or agent.diff_ref is None:
        raise NothingToSign(f"attempt {attempt} of {work_item_id} produced no diff")
    if not this.validation:
        raise NothingToSign(f"attempt {attempt} of {work_item_id} was never validated")
    v = ValidationOutcome.model_validate(this.validation)
    spec: dict[str, Any] = dict(row.spec or {})
    diff = await store.artifact_content(agent.diff_ref.id)
    if diff is None:
        raise NothingToSign(f"the diff of attempt {attempt} of {work_item_id} is missing from the store")
    report = None
    tests = [TestFact(t.id, t.outcome) for t in v.tests]
    counts: dict[str, int] | None = None
    if v.report_ref is not None:
        data = await store.artifact_content(v.report_ref.id)
        name = v.report_ref.name if FILE_NAME.match(v.report_ref.name) else f"attempt-{attempt}-report.xml"
        if data is not None:
            report = FileFact(name, data, "application/xml", v.report_ref.id)
            # The verdict carries at most MAX_VERDICT_TESTS results; the statement is about every test, so the
            # report is read again, by the parser that graded it.
            parsed = parse_report("junit", data)
            if parsed.ok and not parsed.inconsistent:
                tests = [TestFact(t.id, t.outcome) for t in parsed.tests]
                counts = dict(parsed.counts)
    prepared = None
    for e in await store.list_events(work_item_id, limit=100_000):
        if e.type == "environment_prepared" and (e.data or {}).get("attempt") == attempt:
            prepared = e.data
    return Facts(
        work_item_id=row.id,
        tenant_id=row.tenant_id,
        kind=row.kind,
        workflow_id=row.workflow_id,
        # Secret-looking strings a tenant put in its submission are masked, as in the event log.
        submission=mask_secrets(spec),
        repo=row.repo_url,
        ref=(spec.get("repo") or {}).get("ref"),
        base_commit=row.base_commit,
        created_at=row.created_at,
        attempt=attempt,
        attempt_finished_at=this.updated_at,
        passed=v.passed,
        cause=v.cause,
        reason=v.reason,
        exit_code=v.exit_code,
        # A probe is an acceptance test: its id (preview::http::NAME) is listed with the tests it passed or failed.
        tests=tests
        + [TestFact(p.id, "passed" if p.passed else "failed") for p in (v.preview.probes if v.preview else [])],
        tests_executed=v.tests_executed,
        test_counts=counts,
        agent={
            "name": agent.agent,
            "mock": agent.mock,
            "selected_because": agent.selected_because,
            "tokens_used": agent.tokens_used,
            "cost_usd": agent.cost_usd,
        },
        diff=FileFact(
            LANDED_DIFF if landed is not None else f"attempt-{attempt}.diff", diff, "text/x-diff", agent.diff_ref.id
        ),
        sandbox=FileFact(SANDBOX_FILE, canonical(sandbox_record(v)), "application/json"),
        environment=FileFact(ENVIRONMENT_FILE, canonical(environment_record(spec, prepared)), "application/json"),
        validation=FileFact(VALIDATION_FILE, canonical(validation_record(spec, v)), "application/json"),
        report=report,
        transcripts=await probe_files(store, v),
        attempts=[AttemptFact(a.number, a.verdict, a.cause, a.reason) for a in attempts if a.number <= attempt],
        review=review,
        landed=landed,
    )
