"""Signing on the server: the operator's key, the facts of a landed change or an attempt, the bundle as an artifact
and as a git note. Control pools only (they hold the signing key); the activities call this and nothing else of
crewwork.evidence.

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
from crewwork.config.evidence import EvidenceSettings
from crewwork.evidence.facts import Facts, LandedFact, ReviewFact
from crewwork.evidence.format import run_url
from crewwork.evidence.gather import gather
from crewwork.evidence.keys import EvidenceKeyError, load_signer, published_keys
from crewwork.evidence.sign import sign_bundle
from crewwork.evidence.treedigest import commit_info, tree_digest

if TYPE_CHECKING:
    from securesystemslib.signer import CryptoSigner

    from crewwork.store.store import Store

log = logging.getLogger("crewwork.evidence.publish")

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
        signer = load_signer(self.settings.signing_key_file, self.settings.signing_key_env)
        if signer is not None:
            # A key the operator published as retired or revoked signs nothing new: verifiers refuse a revoked key's
            # signatures, and a retired key is one rotated out. Signing on would land changes whose bundles fail.
            for key in published_keys(self.settings):
                if key.keyid == signer.public_key.keyid and key.status != "active":
                    raise EvidenceKeyError(
                        f"the signing key is published as {key.status} (CREWWORK_EVIDENCE_PUBLIC_KEYS): "
                        "configure the new key to sign with"
                    )
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
