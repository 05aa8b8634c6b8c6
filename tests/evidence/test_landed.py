"""A landed change carries a signed evidence bundle, end to end on the real stack (Temporal dev server, PostgreSQL,
bwrap, git): signed by the control pool with the operator's key, kept as an artifact, pushed as a git note next to
the delivery branch (over smart HTTP too, linked from the pull request: tests/repos/test_evidence_notes.py),
downloadable through the API, the client
and the CLI, and verified offline by `crewwork verify`, which refuses it once tampered with."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from crewwork.attestation.keys import generate, load_trusted
from crewwork.attestation.verify import verify_bundle
from crewwork.cli.demo import RIGHT, WRONG
from crewwork.client import AsyncClient
from crewwork.config.attestation import EvidenceSettings, PublishedKeyFile
from crewwork.temporal.devserver import DevServer
from tests.api.conftest import LiveApi, make_tenant
from tests.conftest import make_settings, running_crew
from tests.integration.test_lifecycle import VALIDATION, git

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


def item(url: str, steps: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kind": "code_change",
        "repo": {"url": url, "ref": "main"},
        "instruction": "Fix add() so the tests pass",
        "validation": VALIDATION,
        "agent": {"name": "scripted", "config": {"attempts": steps}},
        "budget": {"max_attempts": 3},
    }
    spec.update(kw)
    return spec


def crewwork(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "crewwork", *args], capture_output=True, text=True, timeout=120)


async def test_a_reviewed_change_lands_with_a_bundle_anyone_can_verify_offline(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str, calc_repo: Path
) -> None:
    key = tmp_path / "keys" / "evidence"
    key.parent.mkdir()
    signing = generate(key)
    old = generate(tmp_path / "keys" / "old")
    settings = make_settings(
        tmp_path / "data",
        temporal_server,
        pg_url,
        sandbox_backend=sandbox_backend,
        auto_register_repos=True,
        evidence=EvidenceSettings(
            signing_key_file=key,
            public_keys=[PublishedKeyFile(file=Path(old.source), status="retired", note="rotated out")],
            builder_id="https://crewwork.test/deployment",
        ),
    )
    async with running_crew(settings) as crew:
        tenant = await make_tenant(crew, "auditor")
        api = LiveApi(settings).start()
        try:
            async with AsyncClient(api.url, tenant.key) as c:
                sub = await c.submit(
                    item(
                        str(calc_repo),
                        [{"files": {"calc.py": WRONG}}, {"files": {"calc.py": RIGHT}}],
                        review={"required": True},
                    )
                )
                wid = sub["id"]
                await c.wait(wid, until=["awaiting_review"], timeout_s=180)
                with pytest.raises(Exception, match="no_evidence_bundle"):
                    await c.evidence_bundle(wid)
                assert (await c.get(wid, live=False))["evidence_bundle"]["status"] == "not_landed"
                await c.review(
                    wid,
                    "approve",
                    comment="looks right",
                    reviewer="alice",
                    attempt=2,
                    line_comments=[{"path": "calc.py", "line": 2, "body": "the fix"}],
                )
                done = await c.wait(wid, timeout_s=180)
                assert done["state"] == "succeeded", done["reason"]
                diff_sha256 = (await c.get(wid))["attempts"][1]["agent"]["diff_ref"]["sha256"]
                commit = done["landed_commit"]
                bundle = await c.evidence_bundle(wid)
                said = (await c.get(wid, live=False))["evidence_bundle"]
                assert said == {
                    "status": "signed",
                    "detail": said["detail"],
                    "url": f"/v1/work-items/{wid}/evidence-bundle",
                }
                keys_doc = await c.evidence_keys()
                # One attempt's bundle, on request: the failed first attempt.
                first = await c.sign_evidence_bundle(wid, 1)
                assert await c.evidence_bundle(wid, attempt=1) == first
                # Asked again, it is already signed with the current key: the same bundle, and nothing is signed or
                # recorded again (each POST used to re-read and re-sign everything on the shared control pool and
                # append another `evidence_signed` to the item's log, at the tenant's request rate).
                assert await c.sign_evidence_bundle(wid, 1) == first
                async with httpx.AsyncClient(base_url=api.url) as anonymous:
                    assert (await anonymous.get("/evidence/keys")).json() == keys_doc, "public keys need no API key"
                    assert (await anonymous.get(f"/v1/work-items/{wid}/evidence-bundle")).status_code == 401
                with pytest.raises(Exception, match="nothing_to_sign"):
                    await c.sign_evidence_bundle(wid, 7)
        finally:
            api.stop()
        events = [e for e in await crew.store.list_events(wid) if e.type == "evidence_signed"]
        assert [e.data.get("scope") for e in events] == [None, "attempt"]
        assert events[0].data["note_ref"] == f"refs/notes/crewwork/{wid}"
        assert events[0].data["keyids"] == [signing.keyid]

    # The published keys: the signing key (active) and the rotated-out one (retired).
    assert {(k["keyid"], k["status"]) for k in keys_doc["keys"]} == {(signing.keyid, "active"), (old.keyid, "retired")}
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps(keys_doc))
    # The git note on the landed commit, in the item's own notes ref, is the bundle the API serves.
    note = subprocess.run(
        ["git", "notes", f"--ref=crewwork/{wid}", "show", commit], cwd=calc_repo, capture_output=True, check=True
    ).stdout
    assert note == bundle
    assert git(calc_repo, "rev-parse", f"crewwork/{wid}") == commit

    report = verify_bundle(bundle, load_trusted([keys_file]), repo=calc_repo, work_item=wid, commit=f"crewwork/{wid}")
    assert report.ok, report.problems
    p = report.proven
    assert p["review"]["decision"] == "approve" and p["review"]["reviewer"] == "alice"
    assert p["review"]["apiKey"] == tenant.key_id, "the reviewer's API key, as the API saw it"
    # What the console and `crewwork status` show of the decision: the diff it was about and its line comments.
    assert p["review"]["lineComments"] == [{"path": "calc.py", "line": 2, "side": "new", "body": "the fix"}]
    assert p["review"]["diffSha256"] == diff_sha256
    assert p["mock"] is True and p["agent"]["name"] == "scripted"
    assert p["tests"]["result"] == "PASSED" and len(p["tests"]["passed"]) == 2
    assert [a["verdict"] for a in p["attempts"]] == ["failed", "passed"]
    assert p["sandbox"]["backend"] == sandbox_backend and p["sandbox"]["network"] == "none"
    assert p["sandbox"]["limits"]["timeout_s"] == 60
    assert p["builder"] == "https://crewwork.test/deployment"
    assert set(report.checked) >= {"git:commit", "git:tree", "landed.patch", "sandbox.json", "environment.json"}

    # The CLI, offline: passes on the untouched bundle, exit 6 naming the problem on a tampered one.
    path = tmp_path / "bundle.json"
    path.write_bytes(bundle)
    ok = crewwork(
        "verify", str(path), "--repo", str(calc_repo), "--key", str(keys_file), "--commit", commit, "--work-item", wid
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "crewwork verify: OK" in ok.stdout and "approve by 'alice'" in ok.stdout and "MOCK" in ok.stdout
    d = json.loads(bundle)
    d["files"]["landed.patch"]["base64"] = d["files"]["attempt-2-junit.xml"]["base64"]
    path.write_text(json.dumps(d))
    bad = crewwork("verify", str(path), "--repo", str(calc_repo), "--key", str(keys_file), "--json")
    assert bad.returncode == 6
    assert any("subject landed.patch" in p for p in json.loads(bad.stdout)["problems"])
    # Only the current key given: the bundle verifies; only the rotated-out one: refused.
    pem_only = crewwork("verify", "-", "--repo", str(calc_repo), "--key", old.source)
    assert pem_only.returncode != 0
    attempt = verify_bundle(first, load_trusted([keys_file]))
    assert attempt.ok, attempt.problems
    assert attempt.proven["scope"] == "attempt" and attempt.proven["tests"]["result"] == "FAILED"


async def test_without_a_key_a_change_lands_unsigned_and_says_so_and_with_one_required_nothing_lands(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str, calc_repo: Path
) -> None:
    settings = make_settings(tmp_path / "a", temporal_server, pg_url, sandbox_backend=sandbox_backend)
    async with running_crew(settings) as crew:
        wid = await crew.submit(item(str(calc_repo), [{"files": {"calc.py": RIGHT}}]))
        result = await crew.result(wid)
        assert result.state == "succeeded", result.reason
        unsigned = [e.data for e in await crew.store.list_events(wid) if e.type == "evidence_unsigned"]
        assert len(unsigned) == 1 and "no evidence signing key" in unsigned[0]["reason"]
        assert git(calc_repo, "notes", f"--ref=crewwork/{wid}", "list") == ""
        # Said wherever the item's evidence is shown, not only by the bundle's own route: the item view (the API,
        # the Python client, MCP's get_work_item), `crewwork status` and `crewwork evidence`.
        _kid, key = await crew.store.create_api_key(crew.tenant_id, [])
        api = LiveApi(settings).start()
        try:
            async with AsyncClient(api.url, key) as c:
                said = (await c.get(wid, live=False))["evidence_bundle"]
            env = {**os.environ, "CREWWORK_API_URL": api.url, "CREWWORK_API_KEY": key}
            status, evidence = [
                await asyncio.to_thread(
                    subprocess.run,
                    [sys.executable, "-m", "crewwork", command, wid],
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=120,
                )
                for command in ("status", "evidence")
            ]
        finally:
            api.stop()
        assert said is not None and said["status"] == "unsigned" and said["url"] is None, said
        assert said["detail"].startswith("UNSIGNED: landed while no evidence signing key was configured")
        for shown in (status, evidence):
            assert shown.returncode == 0 and "UNSIGNED: landed while no evidence signing key" in shown.stdout, shown
    required = make_settings(
        tmp_path / "b",
        temporal_server,
        pg_url,
        sandbox_backend=sandbox_backend,
        evidence=EvidenceSettings(required=True),
    )
    async with running_crew(required) as crew:
        wid = await crew.submit(item(str(calc_repo), [{"files": {"calc.py": RIGHT}}]))
        result = await crew.result(wid)
        assert result.state == "dead" and "CREWWORK_EVIDENCE_REQUIRED" in result.reason, result.reason
        assert git(calc_repo, "branch", "--list", f"crewwork/{wid}") == "", "nothing was pushed"


async def test_an_unusable_signing_key_is_named_by_its_setting_never_by_its_path(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str, calc_repo: Path
) -> None:
    """Where the operator keeps the signing key is the operator's: a tenant whose change cannot be signed learns that
    (and which setting to ask about), not the key file's path and why it cannot be read. Before, the item ended
    `dead` with reason `EvidenceUnavailable: evidence signing key: signing key /srv/…/evidence-2026: No such file or
    directory` (in the API, the event log and every webhook), and the per-attempt bundle's 503 said the same."""
    secret_path = tmp_path / "operator-secrets-7f3a" / "evidence-2026"
    settings = make_settings(
        tmp_path / "data",
        temporal_server,
        pg_url,
        sandbox_backend=sandbox_backend,
        auto_register_repos=True,
        evidence=EvidenceSettings(signing_key_file=secret_path),
    )
    async with running_crew(settings) as crew:
        tenant = await make_tenant(crew, "curious")
        api = LiveApi(settings).start()
        try:
            async with AsyncClient(api.url, tenant.key) as c:
                wid = (await c.submit(item(str(calc_repo), [{"files": {"calc.py": RIGHT}}])))["id"]
                done = await c.wait(wid, timeout_s=180)
                async with httpx.AsyncClient(base_url=api.url, headers={"Authorization": f"Bearer {tenant.key}"}) as h:
                    seen = [
                        (await h.get(f"/v1/work-items/{wid}")).text,
                        (await h.get(f"/v1/work-items/{wid}/events")).text,
                    ]
                    signed = await h.post(f"/v1/work-items/{wid}/evidence-bundle", params={"attempt": 1})
                    seen.append(signed.text)
        finally:
            api.stop()
    assert done["state"] == "dead", done["reason"]
    assert "CREWWORK_EVIDENCE_SIGNING_KEY_FILE" in done["reason"], done["reason"]
    assert signed.status_code == 503 and signed.json()["code"] == "evidence_unavailable", signed.text
    for text in seen:
        assert "operator-secrets-7f3a" not in text and "evidence-2026" not in text, text


# What the code under test can make of its own report: at exit (after pytest wrote it), a JUnit report just under
# the 16 MiB the host reads back, of 14,000 passing tests whose ids are as long as a test id may be recorded.
HUGE_REPORT = RIGHT + (
    "\n\nimport atexit, os\n\n\n"
    "def _report():\n"
    "    if not os.path.isdir('.crewwork'):\n"
    "        return\n"
    "    cases = ''.join(\n"
    "        '<testcase classname=\"tests.test_calc\" name=\"test_%05d_%s\"/>' % (i, 'x' * 980) for i in range(14000)\n"
    "    )\n"
    "    with open('.crewwork/junit.xml', 'w') as f:\n"
    '        f.write(\'<testsuite tests="14000" failures="0" errors="0">%s</testsuite>\' % cases)\n\n\n'
    "atexit.register(_report)\n"
)


async def test_a_change_whose_report_names_thousands_of_long_test_ids_lands_with_a_bundle_that_verifies(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str, calc_repo: Path
) -> None:
    """The test ids a bundle lists come from the report, which the code under test writes. Before, 14,000 ids of
    1,000 characters made a bundle of ~21 MB: the landing pushed the branch and the note, then could not store the
    bundle (over the 16 MiB artifact limit), retried until the item was `dead`, its change pushed and no bundle to
    download; with more ids the signed bundle would pass the 64 MiB a verifier reads. The lists are bounded (the
    JUnit report, a signed subject, holds every id), the bundle is stored, and it verifies, saying how many there were
    and that it left some out. (And below the bound every test is listed: the statement named only the 200 tests a
    verdict carries, so a suite of 5,000 passing tests was signed, and shown by verify, as "200 passed".)"""
    key = tmp_path / "keys" / "evidence"
    key.parent.mkdir()
    generate(key)
    settings = make_settings(
        tmp_path / "data",
        temporal_server,
        pg_url,
        sandbox_backend=sandbox_backend,
        evidence=EvidenceSettings(signing_key_file=key),
    )
    async with running_crew(settings) as crew:
        # The report is forged from inside the test process, which the outcome witness and the scan for runner code
        # would refuse (suspected_tampering); this test is about a huge report that lands, so both are turned off.
        validation = {**VALIDATION, "protect": {"witness": "off", "runner_code": "allow"}}
        steps = [{"files": {"calc.py": HUGE_REPORT}}]
        wid = await crew.submit(item(str(calc_repo), steps, validation=validation, budget={"max_attempts": 1}))
        result = await crew.result(wid, timeout_s=600)
        assert result.state == "succeeded", result.reason
        arts = [a for a in await crew.store.list_artifacts(wid) if a.name == "evidence-bundle.json"]
        assert len(arts) == 1
        bundle = await crew.store.artifact_content(arts[0].id)
        report_art = next(a for a in await crew.store.list_artifacts(wid) if a.name == "attempt-1-junit.xml")
        junit = await crew.store.artifact_content(report_art.id)
    assert bundle is not None and junit is not None
    files = tmp_path / "files"
    files.mkdir()
    (files / "attempt-1-junit.xml").write_bytes(junit)
    report = verify_bundle(
        bundle, load_trusted([Path(f"{key}.pub")]), repo=calc_repo, files_dir=files, work_item=wid,
        commit=result.landed_commit,
    )  # fmt: skip
    assert report.ok, report.problems
    tests = report.proven["tests"]
    assert tests["result"] == "PASSED" and 200 < len(tests["passed"]) < 14000, len(tests["passed"])
    assert tests["counts"]["passed"] == 14000 and tests["counts"]["complete"] is False, tests["counts"]
    assert "not listed" in report.human()
