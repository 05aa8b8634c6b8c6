"""Late-starting zombies: an activity attempt delivered to a worker that then froze *before its first write* (a GC
pause, SIGSTOP, a VM freeze, a slow start) while Temporal retried the step elsewhere. Whenever it wakes, its first
write is refused (its rank was fixed when Temporal scheduled it, and a later attempt has written) and it stops before
doing any work: no agent run, no model call, no validation, no landing. Real `crewwork` pool processes frozen with a
real SIGSTOP, a second worker doing the retry, real Temporal and PostgreSQL, bubblewrap sandboxes."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from crewwork.cli.demo import RIGHT
from crewwork.models import ReviewDecision
from crewwork.store.store import Rank
from crewwork.workers.pools import build_worker
from tests.conftest import Crew, make_settings, running_crew
from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.reliability.conftest import holding_pool
from tests.reliability.test_faults import assert_invariants, calc, code_change, git, terminal, until

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

POOL_OF = {"run_agent": "agent", "validate_change": "validate", "land_change": "control"}


@pytest.fixture
def settings(tmp_path: Path, temporal_server: Any, pg_url: str, sandbox_backend: str) -> Any:
    return make_settings(tmp_path, temporal_server, pg_url, sandbox_backend=sandbox_backend)


@contextlib.asynccontextmanager
async def extra_worker(crew: Crew, pool: str) -> AsyncIterator[None]:
    """A second, healthy worker of `pool` (in this process) for Temporal to retry the frozen attempt on."""
    async with build_worker(pool, crew.client, crew.store, crew.settings):
        yield


async def freeze_at_first_write(proc: Any, marker_dir: Path, activity: str) -> None:
    await until(f"attempt 1 of {activity} to reach the held worker", lambda: _exists(marker_dir / f"{activity}.held"))
    proc.proc.send_signal(signal.SIGSTOP)
    (marker_dir / "go").touch()  # seen only once the process runs again


async def _exists(path: Path) -> bool:
    return path.exists()


def thaw(proc: Any) -> None:
    proc.proc.send_signal(signal.SIGCONT)


async def refusal(crew: Crew, wid: str, writer: str, kind: str = "stale_write_rejected") -> Any:
    async def found() -> Any:
        return next(
            (e for e in await crew.store.list_events(wid) if e.type == kind and e.data["writer"] == writer), None
        )

    return await until(f"{writer}'s first write to be refused", found, timeout_s=60)


@pytest.mark.parametrize("activity", ["run_agent", "validate_change"])
async def test_an_execution_attempt_frozen_before_its_first_write_is_refused_when_it_wakes(
    settings: Any, tmp_path: Path, activity: str
) -> None:
    """The issue's reproduction: attempt 1 frozen past the heartbeat timeout, attempt 2 runs on another worker and
    the item moves on to review; then attempt 1 wakes. Its first write is refused, the stored state does not go
    back, the event log and the attempt record name the same diff, and the zombie does no work."""
    repo = calc(tmp_path / "zombie")
    markers = tmp_path / "markers"
    pool = POOL_OF[activity]
    others = tuple(p for p in ("control", "agent", "validate") if p != pool)
    with holding_pool(settings, pool, activity, markers) as frozen:
        async with running_crew(settings, pools=others) as crew:
            wid = await crew.submit(code_change(repo, {"files": {"calc.py": RIGHT}}, review={"required": True}))
            await freeze_at_first_write(frozen, markers, activity)
            async with extra_worker(crew, pool):
                row = await crew.wait_state(wid, "awaiting_review", timeout_s=90)
                before = await crew.store.list_events(wid)
                thaw(frozen)
                stale = await refusal(crew, wid, f"{activity}#1")
                after = await crew.store.list_events(wid)
                presented, current = stale.data["presented"], stale.data["current"]
                assert presented["attempt"] == 1 and Rank(**current) > Rank(**presented)
                # Nothing but the refusal was written; the state did not go back and the item is still listed there.
                assert [e.type for e in after[len(before) :]] == ["stale_write_rejected"]
                assert (await crew.store.get_work_item(wid)).state == "awaiting_review"  # type: ignore[union-attr]
                await crew.service.review(row, ReviewDecision(action="approve"))
                final = await terminal(crew, wid)
    assert final.state == "succeeded", final.reason
    events = await crew_events(settings, wid)
    writers = [e["data"].get("writer") for e in events if e["type"] in ("agent_finished", "validation_finished")]
    assert f"{activity}#1" not in writers, "the zombie produced nothing"
    assert git(repo, "show", f"crewwork/{wid}:calc.py") == RIGHT.strip()
    async with running_crew(settings, pools=()) as crew:
        await assert_invariants(crew.store, [wid], temporal=crew)


async def test_a_landing_frozen_before_its_first_write_is_refused_after_the_item_ended(
    settings: Any, tmp_path: Path
) -> None:
    """land_change attempt 1 freezes; attempt 2 lands on another control worker and the item succeeds; attempt 1
    wakes and is refused at once (everything since, the finish included, ranks higher): one landing, the branch
    untouched."""
    repo = calc(tmp_path / "landing")
    markers = tmp_path / "markers"
    with holding_pool(settings, "control", "land_change", markers) as frozen:
        async with running_crew(settings, pools=("agent", "validate")) as crew:
            wid = await crew.submit(code_change(repo, {"files": {"calc.py": RIGHT}}))
            await freeze_at_first_write(frozen, markers, "land_change")
            async with extra_worker(crew, "control"):
                final = await terminal(crew, wid, timeout_s=150)
                assert final.state == "succeeded", final.reason
                branch_before = git(repo, "rev-parse", f"crewwork/{wid}")
                thaw(frozen)
                stale = await refusal(crew, wid, "land_change#1")
                assert Rank(**stale.data["current"]) > Rank(**stale.data["presented"])
                assert git(repo, "rev-parse", f"crewwork/{wid}") == branch_before
                landed = [e for e in await crew.store.list_events(wid) if e.type == "landed"]
                assert len(landed) == 1 and landed[0].data["writer"] == "land_change#2"
                await assert_invariants(crew.store, [wid], temporal=crew)


async def test_a_model_agent_zombie_frozen_before_its_first_write_makes_no_model_call(
    settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model agent's step: the retry on the healthy worker makes the only model call; the zombie, refused at
    its first write, never reaches the provider (a model agent would otherwise be paid twice)."""
    repo = calc(tmp_path / "model")
    markers = tmp_path / "markers"
    fix = "calc.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n"
    env = {
        "FAKE_PROVIDER_KEY": "sk-zombie-0123456789abcdef",
        "CREWWORK_MODEL_ENDPOINTS": json.dumps(
            {"allowed_key_envs": ["FAKE_PROVIDER_KEY"], "allow_work_item_endpoints": True}
        ),
    }
    for k, v in env.items():  # the healthy in-process agent worker reads them too
        monkeypatch.setenv(k, v)
    with FakeOpenAIServer(default=Reply.text(fix, prompt_tokens=100, completion_tokens=20)) as provider:
        with holding_pool(settings, "agent", "run_agent", markers, **env) as frozen:
            async with running_crew(settings, pools=("control", "validate")) as crew:
                item = code_change(repo, {}, review={"required": True})
                item["agent"] = {
                    "name": "model",
                    "config": {"endpoints": {"fake": provider.endpoint_config(api_key_env="FAKE_PROVIDER_KEY")}},
                }
                wid = await crew.submit(item)
                await freeze_at_first_write(frozen, markers, "run_agent")
                async with extra_worker(crew, "agent"):
                    await crew.wait_state(wid, "awaiting_review", timeout_s=90)
                    calls = provider.call_count
                    thaw(frozen)
                    await refusal(crew, wid, "run_agent#1")
                    assert provider.call_count == calls == 1, "only the retry called the model"
                    await assert_invariants(crew.store, [wid], require_terminal=False, temporal=crew)


async def crew_events(settings: Any, wid: str) -> list[dict[str, Any]]:
    async with running_crew(settings, pools=()) as crew:
        return [{"type": e.type, "data": e.data} for e in await crew.store.list_events(wid)]


async def test_a_landing_that_stalled_after_its_first_write_publishes_no_evidence_once_superseded(
    settings: Any, tmp_path: Path
) -> None:
    """land_change attempt 1 has set `landing` and pushed the branch, then stalls just before it signs the evidence
    (its worker still holds the key being rotated out); attempt 2 lands on a worker with the new key, publishes its
    bundle and the item succeeds. When attempt 1 wakes, nothing it would still publish may land: before, it signed
    with the old key, force-pushed its note over the new one by compare-and-swap against whatever was there, and
    stored a second `evidence-bundle.json` that the API then served, all after the item ended."""
    from crewwork.attestation.keys import generate, load_trusted
    from crewwork.attestation.verify import verify_bundle
    from crewwork.config.attestation import EvidenceSettings

    (tmp_path / "keys").mkdir()
    generate(tmp_path / "keys" / "old")
    new_key = generate(tmp_path / "keys" / "new")
    settings = settings.model_copy(update={"evidence": EvidenceSettings(signing_key_file=tmp_path / "keys" / "new")})
    repo = calc(tmp_path / "landing")
    markers = tmp_path / "markers"
    env = {
        "CREWWORK_EVIDENCE_SIGNING_KEY_FILE": str(tmp_path / "keys" / "old"),
        "CREWWORK_TEST_HOLD_AT": "publish_evidence",
    }
    with holding_pool(settings, "control", "land_change", markers, **env):
        async with running_crew(settings, pools=("agent", "validate")) as crew:
            wid = await crew.submit(code_change(repo, {"files": {"calc.py": RIGHT}}))
            await until("land_change attempt 1 to stall", lambda: _exists(markers / "land_change.held"), timeout_s=120)
            async with extra_worker(crew, "control"):
                final = await terminal(crew, wid, timeout_s=150)
                assert final.state == "succeeded", final.reason
                commit = git(repo, "rev-parse", f"crewwork/{wid}")
                note_before = git(repo, "rev-parse", f"refs/notes/crewwork/{wid}")
                (markers / "go").touch()
                await until("the zombie to finish", lambda: _exists(markers / "land_change.done"), timeout_s=120)
                assert git(repo, "rev-parse", f"refs/notes/crewwork/{wid}") == note_before, "the note was replaced"
                arts = await crew.store.list_artifacts(wid)
                bundles = [a for a in arts if a.name == "evidence-bundle.json"]
                assert len(bundles) == 1, [(a.name, a.sha256) for a in bundles]
                # The landed diff is the attempt's own diff artifact: the landing stores no second copy.
                assert not [a for a in arts if a.name == "landed.patch"]
                data = await crew.store.artifact_content(bundles[0].id)
    assert data is not None
    note = subprocess.run(
        ["git", "notes", f"--ref=crewwork/{wid}", "show", commit], cwd=repo, capture_output=True, check=True
    ).stdout
    assert note == data
    new_pub = tmp_path / "keys" / "new.pub"
    report = verify_bundle(data, load_trusted([new_pub]), repo=repo, work_item=wid, commit=commit)
    assert report.ok and report.keys == {new_key.keyid: "active"}, report.problems
