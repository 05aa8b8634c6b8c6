"""Security scanners as evidence, end to end: real Temporal, PostgreSQL, git, the sandbox, Bandit and detect-secrets.

A repository made by the test carries a pre-existing unsafe call (`subprocess.call(cmd, shell=True)`) and a pinned
requirement. The attempt fixes the bug (the tests pass) and also adds an AWS-key-shaped string, a second
`shell=True` call built from its argument, a changed pin and a new requirement. The scanners must name the secret
and the new call by file and line, leave the old call out of what the change introduces, flag the requirements
with their versions, keep a SARIF log, and block the attempt under the default policy. Under a `flag` policy the
same change passes with the findings shown, and a team's own SARIF scanner (a command in the same sandbox, with no
network) plugs in: only its results on lines the diff adds count. A scanner that gives no evidence is shown, and fails
the attempt only when the scanners are required.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from crewwork.attestation.keys import generate, load_trusted
from crewwork.attestation.verify import verify_bundle
from crewwork.cli.render import flag_lines
from crewwork.config.attestation import EvidenceSettings
from crewwork.temporal.devserver import DevServer
from tests.conftest import make_repo
from tests.security.conftest import TEST, VALIDATION, artifact_named, code_change, crew_on, scripted

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

BASE_CALC = """import subprocess


def add(a, b):
    return a - b


def run(cmd):
    return subprocess.call(cmd, shell=True)
"""
CHANGED_CALC = """import subprocess

AWS_ACCESS_KEY_ID = "AKIAIOSFODNN7EXAMPLQ"


def add(a, b):
    return a + b


def run(cmd):
    return subprocess.call(cmd, shell=True)


def deploy(target):
    return subprocess.call("deploy " + target, shell=True)
"""
SECRET_LINE = 3
DEPLOY_LINE = 15
RUN_LINE = 11
BASE_REQS = "requests==2.30.0\n"
CHANGED_REQS = "requests==2.31.0\npyyaml>=6.0\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "repo",
        {"calc.py": BASE_CALC, "tests/test_calc.py": TEST, "conftest.py": "", "requirements.txt": BASE_REQS},
    )


def _item(repo: Path, scanners: dict[str, Any]) -> dict[str, Any]:
    files = {"calc.py": CHANGED_CALC, "requirements.txt": CHANGED_REQS}
    validation = {**VALIDATION, "scanners": scanners}
    return code_change(repo, scripted({"files": files}), validation, review={"required": False})


def _found(v: Any) -> dict[tuple[str, str, int], Any]:
    return {(f.tool, f.path, f.line): f for f in v.scan.findings}


async def test_a_secret_and_an_unsafe_call_the_change_adds_block_it_with_their_lines(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, repo: Path, backend: str
) -> None:
    async with crew_on(tmp_path, temporal_server, pg_url, backend) as crew:
        wid = await crew.submit(_item(repo, {}))
        result = await crew.result(wid, timeout_s=300)
        log = await artifact_named(crew, wid, "attempt-1-scan.sarif")
    v = result.attempts[0].validation
    assert result.state == "failed", result.reason
    assert v is not None and v.cause == "security_finding", (v.cause, v.reason, v.scan)
    assert v.tests_executed == 2 and v.exit_code == 0, "the tests passed: only the scanners decide"
    found = _found(v)
    secret = found[("secrets", "calc.py", SECRET_LINE)]
    assert secret.rule == "AWS Access Key" and secret.blocking
    unsafe = found[("bandit", "calc.py", DEPLOY_LINE)]
    assert unsafe.rule == "B602" and unsafe.severity == "high" and unsafe.blocking
    assert ("bandit", "calc.py", RUN_LINE) not in found, "the call that was there at the base is not introduced"
    assert v.scan.preexisting >= 1
    reqs = {f.message: f for f in v.scan.findings if f.tool == "dependencies"}
    assert set(reqs) == {"requests changed: ==2.30.0 -> ==2.31.0", "pyyaml >=6.0 added"}, reqs
    assert all(not f.blocking and f.path == "requirements.txt" for f in reqs.values())
    assert "calc.py:3: secrets AWS Access Key [blocks]" in v.reason
    assert v.scan.errors == []
    assert v.scan_ref is not None and log is not None
    sarif = json.loads(log)
    assert sarif["version"] == "2.1.0"
    states = {
        (r["ruleId"], r["locations"][0]["physicalLocation"]["region"]["startLine"]): r["baselineState"]
        for run in sarif["runs"]
        for r in run["results"]
    }
    assert states[("B602", DEPLOY_LINE)] == "new" and states[("B602", RUN_LINE)] == "unchanged"


# A team's own scanner: writes SARIF with one result on a line the diff adds (calc.py:15) and one on a line it does
# not touch (tests/test_calc.py:1), and says whether it could reach a listener on the host.
CUSTOM = """
import json, socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2).close()
    net = "network reached"
except OSError:
    net = "network unreachable"
def res(path, line, text):
    return {"ruleId": "T1", "level": "error", "message": {"text": text},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": "file:///" + path},
                                                 "region": {"startLine": line}}}]}
log = {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "teamscan"}},
       "results": [res("calc.py", 15, net), res("tests/test_calc.py", 1, "old")]}]}
json.dump(log, open(".crewwork/team.sarif", "w"))
"""


async def test_under_a_flag_policy_the_change_passes_with_findings_shown_and_a_custom_sarif_scanner_plugs_in(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, repo: Path
) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    scanners = {
        "secrets": "flag",
        "python": "flag",
        "custom": [
            {
                "name": "teamscan",
                # bwrap shows the workspace at /workspace: absolute URIs are made workspace-relative.
                "command": ["python3", "-c", CUSTOM.replace("file:///", "file:///workspace/"), str(port)],
                "sarif_path": ".crewwork/team.sarif",
            }
        ],
    }
    key = tmp_path / "keys" / "evidence"
    key.parent.mkdir()
    generate(key)
    try:
        async with crew_on(
            tmp_path, temporal_server, pg_url, "bwrap", evidence=EvidenceSettings(signing_key_file=key)
        ) as crew:
            wid = await crew.submit(_item(repo, scanners))
            result = await crew.result(wid, timeout_s=300)
            bundle = await artifact_named(crew, wid, "evidence-bundle.json")
            log = await artifact_named(crew, wid, "attempt-1-scan.sarif")
    finally:
        listener.close()
    v = result.attempts[0].validation
    assert result.state == "succeeded", (result.reason, v.scan if v else None)
    # The bundle verifies with the SARIF log as a subject of the test result, and signs what the scanners found.
    assert bundle is not None and log is not None
    files = tmp_path / "files"
    files.mkdir()
    (files / "attempt-1-scan.sarif").write_bytes(log)
    report = verify_bundle(bundle, load_trusted([Path(f"{key}.pub")]), repo=repo, files_dir=files, work_item=wid)
    assert report.ok, report.problems
    assert "attempt-1-scan.sarif" in report.human()
    assert b"AWS Access Key" in bundle or b"QVdTIEFjY2VzcyBLZXk" in bundle or _in_payloads(bundle, "AWS Access Key")
    lines = flag_lines(v.model_dump(mode="json"))
    assert f"    scanner: calc.py:{SECRET_LINE}: secrets AWS Access Key: AWS Access Key added to the source" in lines
    assert v is not None and v.cause == "passed"
    found = _found(v)
    assert not any(f.blocking for f in v.scan.findings)
    assert found[("secrets", "calc.py", SECRET_LINE)].rule == "AWS Access Key"
    assert found[("bandit", "calc.py", DEPLOY_LINE)].rule == "B602"
    team = [f for f in v.scan.findings if f.tool == "teamscan"]
    assert [(f.path, f.line, f.message) for f in team] == [("calc.py", 15, "network unreachable")], team
    assert v.scan.tools == ["dependencies", "secrets", "bandit", "teamscan"]


def _in_payloads(bundle: bytes, text: str) -> bool:
    """Whether `text` is in any base64 payload of the bundle's envelopes."""
    import base64

    def walk(x: Any) -> bool:
        if isinstance(x, dict):
            return any(walk(v) for v in x.values()) or (
                isinstance(x.get("payload"), str) and text.encode() in base64.b64decode(x["payload"] + "==")
            )
        if isinstance(x, list):
            return any(walk(v) for v in x)
        return False

    return walk(json.loads(bundle))


async def test_a_scanner_that_gives_no_evidence_fails_the_attempt_only_when_required(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, repo: Path
) -> None:
    broken = {"name": "broken", "command": ["python3", "-c", "raise SystemExit(3)"], "sarif_path": ".crewwork/b.sarif"}
    base = {"secrets": "off", "python": "off", "dependencies": "off", "custom": [broken]}
    async with crew_on(tmp_path, temporal_server, pg_url, "bwrap") as crew:
        shown = await crew.submit(_item(repo, base))
        required = await crew.submit(_item(repo, {**base, "required": True}))
        shown_result = await crew.result(shown, timeout_s=300)
        required_result = await crew.result(required, timeout_s=300)
    v = shown_result.attempts[0].validation
    assert shown_result.state == "succeeded" and v is not None
    assert v.scan.errors == ["broken: exited 3 and left no SARIF log at .crewwork/b.sarif"], v.scan
    r = required_result.attempts[0].validation
    assert required_result.state == "failed" and r is not None and r.cause == "scan_failed", r
    assert "broken: exited 3" in r.reason
