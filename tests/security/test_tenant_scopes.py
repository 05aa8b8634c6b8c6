"""Operator scopes name tenants by name or by id (TenantRef, docs/repositories.md), so a tenant's *name* must never be
able to pass for another tenant's *id*.

The attack: tenant `acme` has id `tn_…`; the operator scopes acme's credential, setup secret and repository roots by
that id. `crewwork keys create --tenant tn_…` (the operator giving acme another key the way `crewwork repos --tenant`
takes "name or id") used to create a *new* tenant named `tn_…`: its keys then met every scope written with acme's id,
and it used acme's private-repository credential, acme's setup secret (and so whatever acme's private index serves)
and acme's repository roots. Now an id-shaped name is refused as a new tenant's name (it names the existing tenant
instead), and a name that looks like an id never matches a scope, so a tenant left over from an older release that
carries such a name gets nothing meant for the id.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from crewwork.boundary.urls import parse_repo_url
from crewwork.config import Settings
from crewwork.config.repos import RepoCredential, SetupSecret
from crewwork.models import EnvironmentSpec, TenantRef
from crewwork.models.ids import new_id
from crewwork.repos.credentials import CredentialError, Credentials
from crewwork.repos.environment import EnvironmentRejected, check_environment
from crewwork.store.store import Store
from crewwork.store.tables import Tenant

pytestmark = [pytest.mark.postgres]


def scoped_to(tenant: str, tmp_path: Path) -> tuple[Credentials, Settings]:
    token = tmp_path / "token"
    token.write_text("acme-private-token-9f1\n")
    cred = RepoCredential(kind="https_token", match=["https://git.example/acme/"], secret_file=token, tenants=[tenant])
    settings = Settings(
        data_dir=tmp_path / "data",
        setup_secrets={"acme-index": SetupSecret(file=token, env="PIP_INDEX_URL", tenants=[tenant])},
        tenant_repo_roots={tenant: [str(tmp_path / "acme-repos")]},
    )
    return Credentials({"acme-git": cred}), settings


def refused_everything(ref: TenantRef, creds: Credentials, settings: Settings, roots: Path) -> None:
    url = parse_repo_url("https://git.example/acme/private.git")
    with pytest.raises(CredentialError, match="not available to this tenant"):
        creds.select(url, ref, name="acme-git")
    assert creds.select(url, ref) is None, "the credential is never chosen for another tenant"
    with pytest.raises(EnvironmentRejected, match="not available to this tenant"):
        check_environment(EnvironmentSpec(setup=[["true"]], secrets=["acme-index"]), settings, ref)
    assert settings.repo_roots_for(ref.id, ref.name) != [roots.resolve()], "nor are the tenant's repository roots"


async def test_a_key_made_for_a_tenant_id_belongs_to_that_tenant(pg_store: Store, tmp_path: Path) -> None:
    acme = await pg_store.ensure_tenant(f"scope-acme-{new_id('x')}")
    _kid, plain = await pg_store.create_api_key(acme)
    principal = await pg_store.authenticate(plain)
    assert principal is not None
    assert principal.tenant_id == acme, "a key made with --tenant <id> is that tenant's, not a new tenant's"
    assert await pg_store.tenant_by_name(acme) is None, "no tenant is named like another tenant's id"


async def test_an_id_shaped_name_that_names_no_tenant_is_refused(pg_store: Store) -> None:
    with pytest.raises(ValueError, match="looks like a tenant id"):
        await pg_store.ensure_tenant(new_id("tn"))


async def test_a_tenant_named_like_another_tenants_id_gets_nothing_scoped_to_that_id(
    pg_store: Store, tmp_path: Path
) -> None:
    acme = await pg_store.ensure_tenant(f"scope-acme-{new_id('x')}")
    # A tenant an older release created with `keys create --tenant <acme's id>`.
    impostor = new_id("tn")
    async with pg_store.session() as s:
        s.add(Tenant(id=impostor, name=acme, created_at=0.0))
    ref = await pg_store.tenant_ref(impostor)
    assert ref.name == acme
    creds, settings = scoped_to(acme, tmp_path)
    refused_everything(ref, creds, settings, tmp_path / "acme-repos")
    # acme itself, by id, keeps everything.
    own = await pg_store.tenant_ref(acme)
    assert creds.select(parse_repo_url("https://git.example/acme/x.git"), own, name="acme-git") == "acme-git"
    check_environment(EnvironmentSpec(setup=[["true"]], secrets=["acme-index"]), settings, own)
    assert settings.repo_roots_for(own.id, own.name) == [(tmp_path / "acme-repos").resolve()]
