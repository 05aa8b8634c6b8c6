"""A key the operator publishes as revoked or retired signs nothing new: bundles it signed would fail verification
(revoked) or come from a key rotated out (retired). The signer refuses at load, naming the setting, not the path."""

from __future__ import annotations

from pathlib import Path

import pytest

from crewwork.config.evidence import EvidenceSettings, PublishedKeyFile
from crewwork.evidence.keys import generate
from crewwork.evidence.publish import EvidenceUnavailable, Publisher


@pytest.mark.parametrize("status", ["revoked", "retired"])
def test_a_signing_key_published_as_not_active_is_refused(tmp_path: Path, status: str) -> None:
    key = tmp_path / "signing"
    generate(key)
    # The same public half, listed again under another name with its new status (as an operator revoking it would).
    listed = tmp_path / "old.pub"
    listed.write_bytes((tmp_path / "signing.pub").read_bytes())
    settings = EvidenceSettings(signing_key_file=key, public_keys=[PublishedKeyFile(file=listed, status=status)])
    with pytest.raises(EvidenceUnavailable) as refused:
        Publisher(settings).ready()
    assert "CREWWORK_EVIDENCE_SIGNING_KEY_FILE" in str(refused.value)
    assert str(tmp_path) not in str(refused.value)


def test_a_signing_key_with_other_keys_retired_still_signs(tmp_path: Path) -> None:
    key, old = tmp_path / "signing", tmp_path / "old"
    generate(key)
    generate(old)
    settings = EvidenceSettings(
        signing_key_file=key, public_keys=[PublishedKeyFile(file=tmp_path / "old.pub", status="revoked")]
    )
    signer = Publisher(settings).ready()
    assert signer is not None and signer.public_key.keyid != ""
