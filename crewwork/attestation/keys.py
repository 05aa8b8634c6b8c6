"""The operator's signing key, public keys and their ids, keys documents, and key generation.

Keys are Ed25519 (PEM: PKCS#8 for the private key, SubjectPublicKeyInfo for the public one). A key id is
securesystemslib's default: the sha256 of the canonical JSON of the key's type, scheme and public value, so it is
computed from the key material, never taken from a label: two documents cannot give one key two ids, and a threshold
counts distinct keys.

A keys document (what `GET /evidence/keys` serves and `crewwork signing-key show` prints) lists every key an operator
has signed with, each `active`, `retired` (rotated out: bundles it signed still verify) or `revoked` (compromised:
nothing it signed verifies):

    {"keys": [{"keyid": "…", "keytype": "ed25519", "scheme": "ed25519", "status": "active", "note": "…",
               "public_key_pem": "-----BEGIN PUBLIC KEY-----\\n…"}]}
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from securesystemslib.signer import CryptoSigner, SSlibKey

from crewwork.attestation.canonical import StrictJSONError, strict_loads

if TYPE_CHECKING:
    from crewwork.config.attestation import EvidenceSettings

log = logging.getLogger("crewwork.attestation.keys")

KeyStatus = Literal["active", "retired", "revoked"]
MAX_KEY_FILE_BYTES = 64 * 1024
MAX_KEYS = 64


class EvidenceKeyError(ValueError):
    """A key or keys document cannot be used; the message names the file and why."""


@dataclass(frozen=True)
class PublicKey:
    key: SSlibKey
    status: KeyStatus = "active"
    note: str = ""
    source: str = ""
    """Where it was read from (a file name), for messages."""

    @property
    def keyid(self) -> str:
        return self.key.keyid

    def pem(self) -> str:
        return _public_pem(self.key)

    def document(self) -> dict[str, Any]:
        return {
            "keyid": self.keyid,
            "keytype": self.key.keytype,
            "scheme": self.key.scheme,
            "status": self.status,
            "note": self.note,
            "public_key_pem": self.pem(),
        }


def _public_pem(key: SSlibKey) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return key._crypto_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()


def _read_bounded(path: Path, what: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise EvidenceKeyError(f"{what} {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise EvidenceKeyError(f"{what} {path} is not a regular file")
        data = os.read(fd, MAX_KEY_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise EvidenceKeyError(f"{what} {path} is larger than {MAX_KEY_FILE_BYTES} bytes")
    return data


def signer_from_pem(pem: bytes, source: str) -> CryptoSigner:
    """The signer of an Ed25519 private key in PEM (PKCS#8, unencrypted)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        private = load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise EvidenceKeyError(f"signing key {source} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise EvidenceKeyError(
            f"signing key {source} is a {type(private).__name__}; crewwork signs with Ed25519 keys only"
        )
    return CryptoSigner(private)


def key_file_exposure(path: Path) -> str | None:
    """Why a private key file is readable by more than its owner ("mode 0644: its group and others may read it"), or
    None. The file is opened without following a link, as it is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None  # reading it says why
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
    finally:
        os.close(fd)
    if not mode & 0o077:
        return None
    who = " and ".join(w for w, bits in (("its group", 0o070), ("others", 0o007)) if mode & bits)
    return f"mode {mode:04o}: {who} may read it (chmod 600 it; ssh refuses such a key too)"


def load_signer(
    key_file: Path | None, key_env: str | None, *, permissions: Literal["refuse", "warn"] = "refuse"
) -> CryptoSigner | None:
    """The operator's signing key from a file or an environment variable (the settings name which; both is an
    error), or None when neither is set. A key file its group or others may read is refused (`permissions`
    "refuse") or used ("warn": the caller says so, crewwork.attestation.publish)."""
    if key_file is not None and key_env:
        raise EvidenceKeyError(
            "both CREWWORK_EVIDENCE_SIGNING_KEY_FILE and CREWWORK_EVIDENCE_SIGNING_KEY_ENV are set; name one"
        )
    if key_file is not None:
        exposed = key_file_exposure(key_file)
        if exposed is not None and permissions == "refuse":
            raise EvidenceKeyError(
                f"signing key {key_file} is {exposed}; CREWWORK_EVIDENCE_KEY_FILE_PERMISSIONS=warn uses it anyway"
            )
        return signer_from_pem(_read_bounded(key_file, "signing key"), str(key_file))
    if key_env:
        value = os.environ.get(key_env)
        if not value:
            raise EvidenceKeyError(f"CREWWORK_EVIDENCE_SIGNING_KEY_ENV names {key_env}, which is not set or empty")
        return signer_from_pem(value.encode(), f"${key_env}")
    return None


def public_key_from_pem(pem: bytes, source: str) -> SSlibKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        public = load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        raise EvidenceKeyError(f"{source} is not a PEM public key: {exc}") from None
    if not isinstance(public, Ed25519PublicKey):
        raise EvidenceKeyError(f"{source} is a {type(public).__name__}; crewwork evidence keys are Ed25519")
    return SSlibKey.from_crypto(public)


def load_trusted(paths: Iterable[Path]) -> list[PublicKey]:
    """Keys a verifier trusts: each file is a PEM public key (trusted as `active`) or a keys document. A key given
    twice keeps its most restrictive status (revoked over retired over active)."""
    found: dict[str, PublicKey] = {}
    for path in paths:
        data = _read_bounded(path, "key")
        keys = (
            _document_keys(data, str(path))
            if data.lstrip().startswith(b"{")
            else [PublicKey(public_key_from_pem(data, str(path)), source=str(path))]
        )
        for k in keys:
            seen = found.get(k.keyid)
            if seen is None or _RANK[k.status] > _RANK[seen.status]:
                found[k.keyid] = k
    if len(found) > MAX_KEYS:
        raise EvidenceKeyError(f"more than {MAX_KEYS} keys given")
    return list(found.values())


_RANK = {"active": 0, "retired": 1, "revoked": 2}


def _document_keys(data: bytes, source: str) -> list[PublicKey]:
    try:
        doc = strict_loads(data, max_depth=8)
    except StrictJSONError as exc:
        raise EvidenceKeyError(f"keys document {source}: {exc}") from None
    rows = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or len(rows) > MAX_KEYS:
        raise EvidenceKeyError(f"keys document {source} has no `keys` list (or more than {MAX_KEYS})")
    out = []
    for i, row in enumerate(rows):
        where = f"{source} keys[{i}]"
        if not isinstance(row, dict) or not isinstance(row.get("public_key_pem"), str):
            raise EvidenceKeyError(f"{where} has no public_key_pem")
        status = row.get("status", "active")
        if status not in _RANK:
            raise EvidenceKeyError(f"{where}: status {status!r} is not active, retired or revoked")
        key = public_key_from_pem(row["public_key_pem"].encode(), where)
        if row.get("keyid") not in (None, key.keyid):
            raise EvidenceKeyError(f"{where}: keyid {row.get('keyid')!r} is not the id of its key ({key.keyid})")
        out.append(PublicKey(key, status=status, note=str(row.get("note") or "")[:500], source=where))
    return out


def keys_document(keys: Iterable[PublicKey]) -> dict[str, Any]:
    return {"keys": [k.document() for k in keys]}


def generate(path: Path) -> PublicKey:
    """A new Ed25519 key pair: the private key at `path` (mode 0600, never overwritten) and the public key at
    `path.pub`. Returns the public key."""
    signer = CryptoSigner.generate_ed25519()
    public = signer.public_key
    pub_path = path.with_name(path.name + ".pub")
    for p in (path, pub_path):
        if p.exists() or p.is_symlink():
            raise EvidenceKeyError(f"{p} exists; crewwork never overwrites a key")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(signer.private_bytes)
    pub_path.write_text(_public_pem(public))
    return PublicKey(public, source=str(pub_path))


def published(signer: CryptoSigner | None, extra: Iterable[PublicKey]) -> list[PublicKey]:
    """What a deployment publishes: its signing key's public half (active) and the configured public keys (current,
    retired and revoked ones), each once."""
    out: dict[str, PublicKey] = {}
    if signer is not None:
        out[signer.public_key.keyid] = PublicKey(signer.public_key, note="the current signing key")
    for k in extra:
        if k.keyid not in out or _RANK[k.status] > _RANK[out[k.keyid].status]:
            out[k.keyid] = k
    return list(out.values())


def published_keys(settings: EvidenceSettings) -> list[PublicKey]:
    """What a deployment publishes (GET /evidence/keys): CREWWORK_EVIDENCE_PUBLIC_KEYS, and the signing key's public
    half when `<signing key file>.pub` lies next to it (the private key itself is never read for this)."""
    out: dict[str, PublicKey] = {}
    candidates: list[tuple[Path, str, str]] = [(k.file, k.status, k.note) for k in settings.public_keys]
    if settings.signing_key_file is not None:
        pub = settings.signing_key_file.with_name(settings.signing_key_file.name + ".pub")
        candidates.insert(0, (pub, "active", "the current signing key"))
    for path, status, note in candidates:
        try:
            key = public_key_from_pem(path.read_bytes(), str(path))
        except (OSError, EvidenceKeyError) as exc:
            if path == candidates[0][0] and settings.signing_key_file is not None and not settings.public_keys:
                log.debug("no public key next to the signing key: %s", exc)
            else:
                log.warning("evidence public key %s not published: %s", path, exc)
            continue
        seen = out.get(key.keyid)
        if seen is None or status == "revoked" or (status == "retired" and seen.status == "active"):
            out[key.keyid] = PublicKey(key, status=status, note=note, source=str(path))  # type: ignore[arg-type]
    return list(out.values())
