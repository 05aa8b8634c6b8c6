"""Signing on the server: the operator's key, the facts of a landed change or an attempt, the bundle as an artifact
and as a git note. Control pools only (they hold the signing key); the activities call this and nothing else of
crewwork.attestation.

    land_change:          ready() before anything is pushed (a required bundle with no key stops the landing),
                          then landed_bundle() inside the note push (crewwork.repos.landing.publish_note)
    sign_attempt_bundle:  attempt_bundle(), for one attempt on request
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from crewwork import __version__
from crewwork.attestation.facts import Facts, LandedFact, ReviewFact
from crewwork.attestation.format import run_url
from crewwork.attestation.gather import gather
from crewwork.attestation.keys import EvidenceKeyError, key_file_exposure, load_signer, published_keys
from crewwork.attestation.sign import sign_bundle
from crewwork.attestation.treedigest import commit_info, tree_digest
from crewwork.config.attestation import EvidenceSettings

if TYPE_CHECKING:
    from securesystemslib.signer import CryptoSigner

    from crewwork.store.store import Store

log = logging.getLogger("crewwork.attestation.publish")

BUNDLE_ARTIFACT = "evidence-bundle.json"


def attempt_artifact(attempt: int) -> str:
    return f"attempt-{attempt}-evidence-bundle.json"


@dataclass(frozen=True)
class Signed:
    bundle: bytes
    keyids: list[str]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.bundle).hexdigest()


class EvidenceUnavailable(RuntimeError):
    """Evidence cannot be signed: the key is missing (while required) or unusable. The operator's to fix."""


class Publisher:
    def __init__(self, settings: EvidenceSettings) -> None:
        self.settings = settings

    @functools.cached_property
    def _signer(self) -> CryptoSigner | None:
        s = self.settings
        signer = load_signer(s.signing_key_file, s.signing_key_env, permissions=s.key_file_permissions)
        exposed = key_file_exposure(s.signing_key_file) if s.signing_key_file is not None else None
        if signer is not None and exposed is not None:
            log.warning(
                "evidence signing key %s is %s (used: CREWWORK_EVIDENCE_KEY_FILE_PERMISSIONS=warn)",
                s.signing_key_file,
                exposed,
            )
        if signer is not None:
            why = unpublished(signer, self.settings)
            if why is not None:
                raise EvidenceKeyError(why)
        return signer

    def signer(self) -> CryptoSigner | None:
        """The signing key, or None when none is configured. EvidenceUnavailable when it cannot be loaded.

        The error's message reaches tenants (the item's reason, events, webhooks, the API's 503): it names the
        setting to look at, never the key's path or why it cannot be read, which go to this pool's log."""
        try:
            return self._signer
        except EvidenceKeyError as exc:
            setting = (
                "CREWWORK_EVIDENCE_SIGNING_KEY_FILE"
                if self.settings.signing_key_file is not None
                else "CREWWORK_EVIDENCE_SIGNING_KEY_ENV"
            )
            log.error("evidence signing key (%s) cannot be used: %s", setting, exc)
            raise EvidenceUnavailable(
                f"the evidence signing key ({setting}) cannot be used; the control pool's log says why"
            ) from None

    def ready(self) -> CryptoSigner | None:
        """Check before landing: the signer, or None when evidence is off. A required bundle with no key is an
        error, so that nothing lands unsigned."""
        signer = self.signer()
        if signer is None and self.settings.required:
            raise EvidenceUnavailable(
                "CREWWORK_EVIDENCE_REQUIRED is set but no signing key is configured "
                "(CREWWORK_EVIDENCE_SIGNING_KEY_FILE or CREWWORK_EVIDENCE_SIGNING_KEY_ENV): nothing may land unsigned"
            )
        return signer

    def _sign(self, facts: Facts) -> Signed:
        signer = self.signer()
        if signer is None:
            raise EvidenceUnavailable("no evidence signing key is configured (CREWWORK_EVIDENCE_SIGNING_KEY_FILE)")
        bundle = sign_bundle(
            facts,
            [signer],
            builder_id=self.settings.builder_id,
            version=__version__,
            url=run_url(facts.work_item_id, facts.attempt),
            embed_max_bytes=self.settings.embed_max_bytes,
        )
        return Signed(bundle, [signer.public_key.keyid])

    async def landed_bundle(
        self,
        store: Store,
        *,
        gitdir: Path,
        work_item_id: str,
        attempt: int,
        commit: str,
        branch: str,
        review: ReviewFact,
    ) -> Signed:
        """The bundle of a landed change: `commit` is read from `gitdir` (this host's mirror, which made it)."""
        landed = await asyncio.to_thread(landed_fact, gitdir, commit, branch)
        facts = await gather(store, work_item_id, attempt, landed=landed, review=review)
        return await asyncio.to_thread(self._sign, facts)

    async def attempt_bundle(self, store: Store, work_item_id: str, attempt: int) -> Signed:
        facts = await gather(store, work_item_id, attempt)
        return await asyncio.to_thread(self._sign, facts)


def unpublished(signer: CryptoSigner, settings: EvidenceSettings) -> str | None:
    """Why bundles this signer makes would fail verification against the deployment's own keys document (GET
    /evidence/keys: crewwork.attestation.keys.published_keys), or None. A key published as retired or revoked signs
    nothing new (verifiers refuse a revoked key's signatures; a retired key is one rotated out), and a key published
    nowhere signs bundles nobody can check against the deployment's keys."""
    keyid = signer.public_key.keyid
    for key in published_keys(settings):
        if key.keyid == keyid:
            if key.status != "active":
                return (
                    f"the signing key ({keyid[:16]}…) is published as {key.status} (CREWWORK_EVIDENCE_PUBLIC_KEYS): "
                    "configure the new key to sign with"
                )
            return None
    where = (
        "put its public half next to it as <key file>.pub (`crewwork signing-key generate` writes both) or list it"
        if settings.signing_key_file is not None
        else "list its public half"
    )
    return (
        f"the signing key's public half ({keyid[:16]}…) is in no published keys document: {where} in "
        "CREWWORK_EVIDENCE_PUBLIC_KEYS (status active); every bundle it signed would fail verification against this "
        "deployment's GET /evidence/keys"
    )


@dataclass(frozen=True)
class StartupCheck:
    """What a process that signs (a control pool, `crewwork dev`) or `crewwork config` says about the evidence
    settings before anything runs: `errors` stop it, `warnings` are said loudly. Operator-facing: paths appear."""

    errors: list[str]
    warnings: list[str]


def check_signing_key(settings: EvidenceSettings) -> StartupCheck:
    """The signing key as a control pool will use it, checked at start-up instead of at the first landing (where a
    missing or unusable key ended every item `dead`): it can be read, is not readable by others (or the operator
    chose `warn`), is an Ed25519 key, and its public half is published as active; and a required bundle has a key."""
    errors: list[str] = []
    warnings: list[str] = []
    key_file, key_env = settings.signing_key_file, settings.signing_key_env
    setting = "CREWWORK_EVIDENCE_SIGNING_KEY_FILE" if key_file is not None else "CREWWORK_EVIDENCE_SIGNING_KEY_ENV"
    if key_file is None and not key_env:
        if settings.required:
            errors.append(
                "CREWWORK_EVIDENCE_REQUIRED is set but no signing key is configured (CREWWORK_EVIDENCE_SIGNING_KEY_FILE "
                "or CREWWORK_EVIDENCE_SIGNING_KEY_ENV): every landing would stop"
            )
        return StartupCheck(errors, warnings)
    if key_file is not None and settings.key_file_permissions == "warn":
        exposed = key_file_exposure(key_file)
        if exposed is not None:
            warnings.append(
                f"{setting}: the signing key {key_file} is {exposed}; used anyway "
                "(CREWWORK_EVIDENCE_KEY_FILE_PERMISSIONS=warn)"
            )
    try:
        signer = load_signer(key_file, key_env, permissions=settings.key_file_permissions)
    except EvidenceKeyError as exc:
        errors.append(f"{setting}: {exc}")
        return StartupCheck(errors, warnings)
    if signer is not None:
        why = unpublished(signer, settings)
        if why is not None:
            errors.append(f"{setting}: {why}")
    return StartupCheck(errors, warnings)


def landed_fact(gitdir: Path, commit: str, branch: str) -> LandedFact:
    _tree, parents, committed_at = commit_info(gitdir, commit)
    digest = tree_digest(gitdir, commit)
    return LandedFact(
        commit=commit,
        tree=digest.tree,
        tree_sha256=digest.sha256,
        parent=parents[0] if parents else "",
        branch=branch,
        committed_at=float(committed_at),
    )
