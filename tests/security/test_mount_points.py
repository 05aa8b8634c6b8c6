"""Where a `Mount` may appear inside a sandbox (crewwork/sandbox/base.py). A mount may not cover what the sandbox
provides itself, and that includes covering it from *above*: a mount at `/opt/crewwork` or `/opt` (an operator's
command-agent mount, `"mounts": ["/opt"]` to reach a CLI under /opt) hid the sandbox's own Python at
/opt/crewwork/python behind a host directory, so `python3` in the sandbox was whatever that directory held; in the
production image /opt/crewwork is the worker's own virtualenv, so crewwork's packages and pytest plugins were
visible again. Two mounts one inside the other (`/crewwork` over `/crewwork/io`) hid one behind the other depending on
their order, and a `:` in a place inside was read as Docker's volume syntax. All refused, naming the mount.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crewwork.agents.command import CommandAgentsSettings
from crewwork.models.errors import AgentConfigError
from crewwork.sandbox.backends import SANDBOXES, get_sandbox
from crewwork.sandbox.base import Mount, SandboxLimits, check_mounts

LIMITS = SandboxLimits(memory_mb=256, pids=64, timeout_s=60)


@pytest.fixture
def fake_python(tmp_path: Path) -> Path:
    """A host directory shaped like the sandbox's Python, whose `python3` says so if it ever runs."""
    root = tmp_path / "impostor"
    (root / "python" / "bin").mkdir(parents=True)
    for name in ("python3", "python"):
        exe = root / "python" / "bin" / name
        exe.write_text("#!/bin/sh\necho IMPOSTOR-PYTHON\n")
        exe.chmod(0o755)
    root.chmod(0o755)
    tmp_path.chmod(0o755)
    return root


@pytest.mark.parametrize("inside", ["/opt/crewwork", "/opt"])
async def test_a_mount_cannot_hide_the_sandbox_python_from_above(
    tmp_path: Path, fake_python: Path, inside: str
) -> None:
    ok, why = SANDBOXES["bwrap"].available()
    if not ok:
        pytest.skip(why)
    sandbox = get_sandbox("bwrap")
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        mount = Mount(fake_python if inside == "/opt/crewwork" else fake_python.parent, inside)
    except ValueError as exc:
        assert "/opt/crewwork/python" in str(exc)
        return
    r = await sandbox.run(["python3", "-c", "print('the sandbox python')"], workspace=ws, limits=LIMITS, mounts=[mount])
    assert b"IMPOSTOR" not in r.stdout, f"a mount at {inside} replaced the sandbox's Python"
    pytest.fail(f"a mount at {inside} covers /opt/crewwork/python and was accepted")


@pytest.mark.parametrize("inside", ["/", "/usr", "/etc/ssl", "/tmp/x", "/workspace", "/opt/crewwork/python/bin"])
def test_places_the_sandbox_provides_stay_refused(tmp_path: Path, inside: str) -> None:
    with pytest.raises(ValueError, match="which the sandbox provides itself"):
        Mount(tmp_path, inside)


@pytest.mark.parametrize("inside", ["/opt/tool:rw", "/opt/a\nb", "/opt/a\x00b", "/opt/tool,ro"])
def test_odd_characters_in_a_place_inside_are_refused(tmp_path: Path, inside: str) -> None:
    with pytest.raises(ValueError, match="may not contain"):
        Mount(tmp_path, inside)


def test_mounts_one_inside_another_are_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for pair in ([Mount(a, "/crewwork/io"), Mount(b, "/crewwork")], [Mount(b, "/crewwork"), Mount(a, "/crewwork/io")]):
        with pytest.raises(ValueError, match="inside"):
            check_mounts(pair)
    assert len(check_mounts([Mount(a, "/crewwork/io"), Mount(b, "/crewwork/iox")])) == 2, "siblings are fine"


def test_operator_command_mounts_are_checked_when_the_settings_load(tmp_path: Path) -> None:
    def load(mounts: list[str]) -> CommandAgentsSettings:
        raw = {"commands": {"cli": {"argv": ["cli"], "mounts": mounts}}}
        return CommandAgentsSettings.parse(json.dumps(raw))

    for bad in (["/opt"], [f"{tmp_path}:/opt/crewwork"], [f"{tmp_path}:/usr/local"], [f"{tmp_path}:relative"]):
        with pytest.raises(AgentConfigError, match="CREWWORK_COMMAND_AGENTS is invalid"):
            load(bad)
    assert load([f"{tmp_path}:/opt/aider", "/srv/tools"]).commands["cli"].mounts == [
        f"{tmp_path}:/opt/aider",
        "/srv/tools",
    ]
    # A host path holding a colon takes an explicit place inside (the last colon separates them).
    assert load(["/srv/odd:name:/opt/odd"]).commands["cli"].mounts == ["/srv/odd:name:/opt/odd"]
