"""The repository part of a submission, in one call: which of its tenant's registered repositories a work item names,
the commit its ref names now, whether the forge can open the pull request it asks for, the environment it runs in
(its own, else the registration's, else the operator's default) and the protected paths the registration adds
(docs/repositories.md, "Registered repositories").

`resolve_submission` returns the spec as it is stored and run, or raises what the API answers with: a
`RepositoryRefused` (a `SubmissionRejected` naming the field and the problem's code: a 422) or `RepositoryNotFound`
(a 404, the same whether another tenant has the repository or not). Nothing is stored and nothing runs in a
workspace: the ref is resolved on the remote (`git ls-remote`) or in the local repository's git directory, confined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from crewwork.boundary.masking import too_deep_at, unstorable_at
from crewwork.config import Settings
from crewwork.models import CheckSpec, EnvironmentSpec, RepoSpec, ValidationSpec, WorkItemSpec
from crewwork.models.errors import SubmissionRejected
from crewwork.repos.environment import EnvironmentRejected, check_environment, resolve_environment
from crewwork.repos.registration import RepoAddressRefused, RepoPolicyError, RepositoryChecks
from crewwork.repos.tenancy import RepositoryRegistry
from crewwork.store.store import Store
from crewwork.store.views import StoredRepository


class RepositoryRefused(SubmissionRejected):
    """The submission's repository cannot be used as it asks: `field` names the part of the submission (`repo`,
    `repo.pull_request`, `environment`), `code` the API problem's code."""


@dataclass(frozen=True)
class ResolvedRepository:
    """A submission's repository, checked."""

    spec: WorkItemSpec
    """The submission as it is stored and run: it names the registration (its id, URL and the ref), with the
    registration's protected paths and the resolved environment filled in. What runs is the registration, never the
    tenant's spelling of it."""
    locator: str
    """The registered URL (a remote's normalised URL, or a local repository's absolute path)."""
    commit: str
    """The commit the ref names now: the item's base commit."""


async def resolve_submission(
    spec: WorkItemSpec, tenant_id: str, store: Store, settings: Settings
) -> ResolvedRepository:
    """The repository of a `code_change` submission (`spec.repo`), checked: the tenant registered it and it is still
    usable, the ref exists, the pull request it asks for can be opened, the environment is allowed."""
    if spec.repo is None:
        raise RepositoryRefused("this kind of work item names a repository (`repo`)", "repo")
    checks = RepositoryChecks(settings)
    registry = RepositoryRegistry(store, settings, checks)
    tenant = await store.tenant_ref(tenant_id)
    try:
        reg = await registry.resolve(spec.repo, tenant_id)  # RepositoryNotFound: the 404
        ref = spec.repo.ref or reg.default_ref
        url, commit = await checks.check(
            reg.url, ref, tenant, credential=reg.credential, roots=await registry.roots(tenant_id)
        )
    except RepoAddressRefused as exc:
        raise RepositoryRefused(str(exc), "repo", code="url_not_allowed") from exc
    except RepoPolicyError as exc:
        raise RepositoryRefused(str(exc), "repo") from exc
    try:
        checks.forge(url, spec.repo.pull_request)
    except RepoPolicyError as exc:
        raise RepositoryRefused(str(exc), "repo.pull_request") from exc
    env = _environment(spec, reg, settings, url.url)
    if env is not None:
        try:
            check_environment(env, settings, tenant)
        except EnvironmentRejected as exc:
            raise RepositoryRefused(str(exc), "environment") from exc
    return ResolvedRepository(_as_registered(spec, spec.repo, reg, url.url, ref, env), url.url, commit)


def _environment(spec: WorkItemSpec, reg: StoredRepository, settings: Settings, locator: str) -> EnvironmentSpec | None:
    """The environment the item runs in: its own, else the registration's, else the operator's default."""
    try:
        registered = EnvironmentSpec.model_validate(reg.environment) if reg.environment else None
    except ValidationError as exc:
        # Stored under another release's rules: the registration's text, refused as the submission's fault.
        raise RepositoryRefused(
            f"the repository's registered environment is not one this release takes "
            f"({exc.errors()[0].get('msg', 'invalid')}); register the repository again with a valid one",
            "environment",
        ) from None
    if registered is not None and spec.environment is None:
        # Registered before registrations were checked for it (2026-12-02): say whose text it is.
        bad = unstorable_at(registered) or too_deep_at(registered)
        if bad is not None:
            raise RepositoryRefused(
                f"the repository's registered environment holds text the store cannot keep at {bad}; "
                "register the repository again without it",
                "environment",
                "invalid_text",
            )
    return resolve_environment(spec.environment or registered, settings, locator)


def _as_registered(
    spec: WorkItemSpec, repo: RepoSpec, reg: StoredRepository, url: str, ref: str, env: EnvironmentSpec | None
) -> WorkItemSpec:
    update: dict[str, Any] = {
        "repo": repo.model_copy(update={"id": reg.id, "url": url, "ref": ref}),
        "environment": env,
    }
    validation = spec.validation
    if reg.protect_paths and validation is not None:
        protect = validation.protect
        merged = [*protect.paths, *(p for p in reg.protect_paths if p not in protect.paths)]
        validation = validation.model_copy(update={"protect": protect.model_copy(update={"paths": merged})})
    if reg.checks and validation is not None:
        validation = with_registered_checks(validation, reg.checks)
    if validation is not None:
        update["validation"] = validation
    return spec.model_copy(update=update)


def with_registered_checks(validation: ValidationSpec, registered: list[Any]) -> ValidationSpec:
    """The registration's checks first, each replaced by the work item's check of the same name, then the item's
    others; checked again as one declaration (at most MAX_CHECKS, distinct report paths): RepositoryRefused if not."""
    own = {c.name: c for c in validation.checks}
    try:
        # A stored check this release no longer takes (its rules tightened) is refused here too, never a 500.
        merged: list[CheckSpec] = []
        for stored in registered:
            check = CheckSpec.model_validate(stored)
            merged.append(own.pop(check.name, check))
        merged += [c for c in validation.checks if c.name in own]
        return ValidationSpec.model_validate({**validation.model_dump(), "checks": [c.model_dump() for c in merged]})
    except ValidationError as exc:
        said = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise RepositoryRefused(
            f"validation.checks with the repository's registered checks: {said}", "validation.checks", "invalid"
        ) from None
