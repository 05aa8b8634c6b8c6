"""No cache crosses tenants (docs/sandbox.md, "Caches and tenants"): two tenants register the same public repository
with the same setup command, each naming its own setup secret exposed as the same variable, and a third names none.
Each validation sees only what its own tenant's setup built (its own secret, a module only its setup wrote), no
prepared environment is reused across them, and a tenant's second item reuses its own."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from crewwork.cli.demo import RIGHT
from crewwork.config.repos import SetupSecret
from crewwork.models import WorkItemSpec
from crewwork.temporal.devserver import DevServer
from tests.conftest import Crew, make_settings, running_crew
from tests.repos.conftest import Served
from tests.repos.servers import GitDaemon

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

# The setup writes a module into its environment holding what it saw of $IDX_TOKEN (Base64, so no log masking can
# hide a leak from this test), as a setup that writes a pip configuration or installs from a private index would.
SETUP = (
    'site="$CREWWORK_ENV/lib/$(python3 -c "import sys; print(f\'python{sys.version_info[0]}.{sys.version_info[1]}\')")'
    '/site-packages"; mkdir -p "$site"; '
    'printf "SEEN = %s\\n" "\\"$(printf %s "${IDX_TOKEN:-none}" | base64 -w0)\\"" > "$site/tenant_probe.py"'
)
PROBE = "import tenant_probe; print('SEEN', tenant_probe.SEEN)"
JUNIT = "--junitxml=.crewwork/junit.xml"
VALIDATION = {
    "command": [
        "sh",
        "-c",
        f'python3 -c "{PROBE}" && exec python3 -m pytest -q -p no:cacheprovider --junitxml=.crewwork/junit.xml',
    ],
    "junit_path": ".crewwork/junit.xml",
    "timeout_s": 120,
    "test_files": ["tests/test_calc.py"],
}


# A setup that is not reproducible (as one that installs "the latest" from an index is): what it built is only ever its
# builder's. The nonce is what the setup "downloaded".
NONCE_SETUP = SETUP.replace('"${IDX_TOKEN:-none}"', '"$(cat /proc/sys/kernel/random/uuid)"')


def spec(url: str, secrets: list[str], setup: str = SETUP) -> WorkItemSpec:
    return WorkItemSpec.model_validate(
        {
            "kind": "code_change",
            "repo": {"url": url, "ref": "main"},
            "instruction": "Fix add()",
            "validation": VALIDATION,
            "environment": {"setup": [["sh", "-c", setup]], "secrets": secrets},
            "agent": {"name": "scripted", "config": {"attempts": [{"files": {"calc.py": RIGHT}}]}},
            "budget": {"max_attempts": 1},
            "review": {"required": False},
        }
    )


@pytest.fixture
async def crew(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str, secret_dir: Path
) -> AsyncIterator[Crew]:
    (secret_dir / "a").write_text("token-of-tenant-a-7f3e91\n")
    (secret_dir / "b").write_text("token-of-tenant-b-c04d22\n")
    settings = make_settings(
        tmp_path / "data",
        temporal_server,
        pg_url,
        sandbox_backend=sandbox_backend,
        # Scoped by tenant *name*, as docs/repositories.md writes them; both reach setup as IDX_TOKEN.
        setup_secrets={
            "a-index": SetupSecret(file=secret_dir / "a", env="IDX_TOKEN", tenants=["cache-tenant-a"]),
            "b-index": SetupSecret(file=secret_dir / "b", env="IDX_TOKEN", tenants=["cache-tenant-b"]),
        },
    )
    async with running_crew(settings) as c:
        yield c


async def validate(crew: Crew, tenant_id: str, url: str, secrets: list[str], setup: str = SETUP) -> dict[str, Any]:
    res = await crew.service.submit(tenant_id, spec(url, secrets, setup))
    wid = str(res.row.id)
    result = await crew.result(wid)
    assert result.state == "succeeded", result.reason
    events = await crew.store.list_events(wid)
    # At least once: a validation Temporal timed out and retried prepares again (then warm, from its own build).
    # The first preparation says whether the item reused anything; every one names the same environment.
    prepared_all = [e.data for e in events if e.type == "environment_prepared"]
    assert prepared_all and len({p["key"] for p in prepared_all}) == 1, prepared_all
    prepared = {**prepared_all[-1], "cold": prepared_all[0]["cold"]}
    attempt = (await crew.store.list_attempts(wid))[0]
    log_id = attempt.validation["log_ref"]["id"]  # type: ignore[index]
    log = (await crew.store.artifact_content(log_id) or b"").decode()
    match = re.search(r"^SEEN (\S*)$", log, re.M)
    assert match, log[-2000:]
    return {"key": prepared["key"], "cold": prepared["cold"], "seen": base64.b64decode(match.group(1)).decode()}


async def test_a_prepared_environment_is_never_served_to_another_tenant(
    crew: Crew, daemon: GitDaemon, served: Served
) -> None:
    url = daemon.url(served.name)
    a = await crew.store.ensure_tenant("cache-tenant-a")
    b = await crew.store.ensure_tenant("cache-tenant-b")
    c = await crew.store.ensure_tenant("cache-tenant-c")
    seen_a = await validate(crew, a, url, ["a-index"])
    seen_b = await validate(crew, b, url, ["b-index"])
    seen_c = await validate(crew, c, url, [])
    assert seen_a["seen"] == "token-of-tenant-a-7f3e91"
    assert seen_b["seen"] == "token-of-tenant-b-c04d22", "B sees only what its own setup built with its own secret"
    assert seen_c["seen"] == "none", "a tenant without a secret gets nothing any other tenant's setup built"
    assert seen_a["cold"] and seen_b["cold"] and seen_c["cold"], "no tenant reuses another's environment"
    assert len({seen_a["key"], seen_b["key"], seen_c["key"]}) == 3
    # The same tenant with the same inputs reuses its own environment.
    again = await validate(crew, b, url, ["b-index"])
    assert again == {**seen_b, "cold": False}
    # A secret names a tenant by name: another tenant cannot ask for it.
    from crewwork.api.service import SubmissionRejected

    with pytest.raises(SubmissionRejected, match="not available to this tenant"):
        await crew.service.submit(c, spec(url, ["a-index"]))


async def test_a_rotated_secret_is_a_new_environment(
    crew: Crew, daemon: GitDaemon, served: Served, secret_dir: Path
) -> None:
    url = daemon.url(served.name)
    a = await crew.store.ensure_tenant("cache-tenant-a")
    first = await validate(crew, a, url, ["a-index"])
    (secret_dir / "a").write_text("rotated-token-of-tenant-a-55aa\n")
    second = await validate(crew, a, url, ["a-index"])
    assert second["cold"] and second["key"] != first["key"]
    assert second["seen"] == "rotated-token-of-tenant-a-55aa", "nothing built from the old secret is served"


async def test_identical_public_inputs_are_still_built_once_per_tenant(
    crew: Crew, daemon: GitDaemon, served: Served
) -> None:
    """Same repository, commit and setup, no secret at all: each tenant gets only what its own build produced (the
    default; docs/sandbox.md says why sharing identical public inputs is not offered)."""
    url = daemon.url(served.name)
    d = await crew.store.ensure_tenant("cache-tenant-d")
    e = await crew.store.ensure_tenant("cache-tenant-e")
    first_d = await validate(crew, d, url, [], NONCE_SETUP)
    first_e = await validate(crew, e, url, [], NONCE_SETUP)
    assert first_d["cold"] and first_e["cold"] and first_d["key"] != first_e["key"]
    assert first_d["seen"] != first_e["seen"], "E's validation never runs what D's setup built"
    assert await validate(crew, d, url, [], NONCE_SETUP) == {**first_d, "cold": False}
