"""The host never follows what a setup wrote into its prepared environment (docs/sandbox.md, "The one rule").

A setup's `$CREWWORK_ENV` is the tenant's: links in it point wherever the setup liked. Whether an environment has a
virtualenv used to be decided on the host, at every use, by `(env/venv/pyvenv.cfg).is_file()`, which follows links: a
setup that made `venv/pyvenv.cfg` a link to any host path learnt, from whether its validation ran with `VIRTUAL_ENV`
set, whether that host file exists (a file-existence oracle on the worker, one bit per validation, as root). The
decision is now made once, when the build ends, without following anything, and kept in the entry's marker.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from crewwork.config.sandbox import SandboxSettings
from crewwork.sandbox.backends import SANDBOXES, get_sandbox
from crewwork.sandbox.base import Sandbox, SandboxLimits
from crewwork.sandbox.envplan import CacheOwner
from crewwork.sandbox.prepare import PreparedEnvCache

LIMITS = SandboxLimits(memory_mb=512, pids=128, timeout_s=120)
OWNER = CacheOwner(tenant_id="tn_links", repository="rp_links")


@pytest.fixture(params=[pytest.param("bwrap"), pytest.param("docker", marks=pytest.mark.docker)])
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    ok, why = SANDBOXES[request.param].available()
    if not ok:
        pytest.skip(f"sandbox backend {request.param} is not available: {why} (see docs/sandbox.md)")
    return get_sandbox(request.param, settings=SandboxSettings())


async def test_a_link_in_the_environment_tells_nothing_about_host_files(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    host_file = tmp_path / "only-on-the-host" / "secret.conf"
    host_file.parent.mkdir()
    host_file.write_text("exists\n")
    cache = PreparedEnvCache(tmp_path / "prepared")
    seen = {}
    for probe in (str(host_file), str(tmp_path / "only-on-the-host" / "missing.conf")):
        setup = [["sh", "-c", f'mkdir -p "$CREWWORK_ENV/venv" && ln -s {probe} "$CREWWORK_ENV/venv/pyvenv.cfg"']]
        prepared = await cache.get_or_prepare(
            owner=OWNER, sandbox=sandbox, repo="r", base_commit=probe, setup=setup, source=src, limits=LIMITS
        )
        seen[probe] = prepared.env()
        assert "VIRTUAL_ENV" not in seen[probe], "a link out of the environment is not a virtualenv"
    assert len({tuple(sorted(e.items())) for e in seen.values()}) == 1, "the two probes look the same"


async def test_a_virtualenv_the_setup_made_itself_is_still_used(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    cache = PreparedEnvCache(tmp_path / "prepared")
    setup = [["python3", "-m", "venv", "--without-pip", "/crewwork/env/venv"]]
    if not sandbox.remaps:
        pytest.skip("the local backend sees host paths")
    prepared = await cache.get_or_prepare(
        owner=OWNER, sandbox=sandbox, repo="r", base_commit="c", setup=setup, source=src, limits=LIMITS
    )
    assert prepared.env()["VIRTUAL_ENV"] == "/crewwork/env/venv"
    assert prepared.evidence()["venv"] is True
