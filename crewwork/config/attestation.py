"""CREWWORK_EVIDENCE_*: who signs evidence bundles, with which key, what is published, and where bundles go.

The signing key is read by control pools only (they land changes and sign per-attempt bundles); API processes need
only the public keys they publish. No key is ever sent to or through the API, nor mounted into a sandbox."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class PublishedKeyFile(BaseModel):
    """One public key the deployment publishes (besides its signing key's own public half)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    file: Path = Field(description="PEM public key (SubjectPublicKeyInfo, Ed25519).")
    status: Literal["active", "retired", "revoked"] = Field(
        default="retired",
        description="`active` (another current signer), `retired` (rotated out: what it signed still verifies) or "
        "`revoked` (compromised: nothing it signed verifies).",
    )
    note: str = Field(default="", max_length=500, description="Shown with the key, e.g. when it was rotated out.")


class EvidenceSettings(BaseSettings):
    """Signed evidence bundles (docs/evidence.md; keys: docs/deployment.md, "Evidence signing keys")."""

    model_config = SettingsConfigDict(env_prefix="CREWWORK_EVIDENCE_", extra="ignore")

    signing_key_file: Path | None = Field(
        default=None,
        description="Ed25519 private key (PEM, PKCS#8, unencrypted; mode 0600) that control pools sign bundles with. "
        "Give it to control pools only. Unset (and no _SIGNING_KEY_ENV): changes land without a bundle, and say so.",
    )
    signing_key_env: str | None = Field(
        default=None,
        description="Name of an environment variable holding the signing key's PEM, instead of a file.",
    )
    public_keys: list[PublishedKeyFile] = Field(
        default=[],
        description='Other public keys to publish (JSON list: [{"file": PATH, "status": "retired", "note": …}]): '
        "rotated-out keys (`retired`), compromised ones (`revoked`), another current signer (`active`). API "
        "processes publish these, and `<signing key file>.pub` when it lies next to the key file, at GET "
        "/evidence/keys (an API process never reads the private key).",
    )

    @field_validator("signing_key_env")
    @classmethod
    def _a_variables_name(cls, v: str | None) -> str | None:
        # The key itself put here would be printed as this setting's value (`crewwork config`) and in every error
        # about it; it is refused without being repeated.
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", v):
            raise ValueError(
                "must be the name of an environment variable that holds the key (e.g. EVIDENCE_KEY_PEM), "
                "never the key itself"
            )
        return v

    key_file_permissions: Literal["refuse", "warn"] = Field(
        default="refuse",
        description="A signing key file that its group or others may read (mode 0644, 0640): `refuse` (control pools, "
        "`crewwork dev` and `crewwork config` say so at start-up, and nothing is signed with it) or `warn` (say so "
        "loudly at start-up and use it, e.g. where a secret store mounts files 0444 in a container of its own).",
    )
    required: bool = Field(
        default=False,
        description="Land nothing without a signed bundle: with no signing key configured, landing fails (the item "
        "ends `dead`, naming the setting) before anything is pushed.",
    )
    builder_id: str = Field(
        default="https://crewwork.dev/deployments/unnamed",
        max_length=500,
        description="This deployment's identity in SLSA provenance (`runDetails.builder.id`), e.g. "
        "https://crewwork.example.com. Verifiers print it; set it to something they recognise.",
    )
    notes: Literal["per-item", "off"] = Field(
        default="per-item",
        description="Push each landed change's bundle as a git note on its commit, in the notes ref "
        "refs/notes/crewwork/<work item id> (pushed next to the delivery branch, by compare-and-swap). `off`: the "
        "bundle is only an artifact of the item.",
    )
    embed_max_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=0,
        description="Subject files (diff, JUnit report, sandbox and environment records) are embedded in the bundle "
        "up to this many bytes in all; larger ones are listed by artifact id, for the verifier to be given.",
    )
    public_url: str | None = Field(
        default=None,
        max_length=500,
        description="The API's public base URL, for the bundle's link in pull request bodies (e.g. "
        "https://crewwork.example.com). Unset: the body names the API path and the notes ref only.",
    )
