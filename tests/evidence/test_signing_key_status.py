"""The signing key is checked where it is loaded and at start-up. A key the operator publishes as revoked or retired
signs nothing new: bundles it signed would fail verification
(revoked) or come from a key rotated out (retired). The signer refuses at load, naming the setting, not the path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from crewwork.attestation.keys import generate
from crewwork.attestation.publish import EvidenceUnavailable, Publisher, StartupCheck, check_signing_key
from crewwork.config.attestation import EvidenceSettings, PublishedKeyFile


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


# ------------------------------------------------------------------------------------------ checked at start-up


def test_a_key_file_others_may_read_is_refused_unless_the_operator_says_warn(tmp_path: Path) -> None:
    """The docs say 0600; a key file of mode 0644 was used silently."""
    key = tmp_path / "operator-secrets" / "signing"
    key.parent.mkdir()
    generate(key)
    key.chmod(0o644)
    check = check_signing_key(EvidenceSettings(signing_key_file=key))
    assert len(check.errors) == 1 and "mode 0644" in check.errors[0] and "chmod 600" in check.errors[0]
    assert check.errors[0].startswith("CREWWORK_EVIDENCE_SIGNING_KEY_FILE: ")
    with pytest.raises(EvidenceUnavailable) as refused:
        Publisher(EvidenceSettings(signing_key_file=key)).ready()
    assert "CREWWORK_EVIDENCE_SIGNING_KEY_FILE" in str(refused.value) and "operator-secrets" not in str(refused.value)
    warned = EvidenceSettings(signing_key_file=key, key_file_permissions="warn")
    check = check_signing_key(warned)
    assert check.errors == [] and len(check.warnings) == 1 and "mode 0644" in check.warnings[0]
    assert Publisher(warned).ready() is not None
    key.chmod(0o640)
    assert "its group may read it" in check_signing_key(EvidenceSettings(signing_key_file=key)).errors[0]
    key.chmod(0o600)
    assert check_signing_key(EvidenceSettings(signing_key_file=key)) == StartupCheck([], [])


def test_a_signing_key_whose_public_half_is_published_nowhere_is_a_start_up_error(tmp_path: Path) -> None:
    """It signed every change, and every such bundle failed verification against the deployment's own keys."""
    key = tmp_path / "signing"
    generate(key)
    pub = tmp_path / "elsewhere.pub"
    (tmp_path / "signing.pub").rename(pub)
    settings = EvidenceSettings(signing_key_file=key)
    errors = check_signing_key(settings).errors
    assert len(errors) == 1 and "in no published keys document" in errors[0] and "/evidence/keys" in errors[0]
    with pytest.raises(EvidenceUnavailable):
        Publisher(settings).ready()
    published = EvidenceSettings(signing_key_file=key, public_keys=[PublishedKeyFile(file=pub, status="active")])
    assert check_signing_key(published).errors == [] and Publisher(published).ready() is not None
    # From an environment variable there is no file next to it: its public half must be listed.
    os.environ["I41_TEST_EVIDENCE_KEY"] = key.read_text()
    try:
        from_env = EvidenceSettings(signing_key_env="I41_TEST_EVIDENCE_KEY")
        assert "CREWWORK_EVIDENCE_PUBLIC_KEYS" in check_signing_key(from_env).errors[0]
        listed = from_env.model_copy(update={"public_keys": [PublishedKeyFile(file=pub, status="active")]})
        assert check_signing_key(listed).errors == []
    finally:
        del os.environ["I41_TEST_EVIDENCE_KEY"]


def test_a_missing_key_file_stops_the_control_pool_dev_and_config_naming_the_setting(tmp_path: Path) -> None:
    """A missing signing key file let the stack start and every item run its agent and validation, only to end
    `dead` at landing."""
    from tests.unit.test_cli_input import _bare, one_line_usage_error

    missing = str(tmp_path / "nowhere" / "evidence-2026")
    env = {"CREWWORK_EVIDENCE_SIGNING_KEY_FILE": missing, "CREWWORK_TEMPORAL_ADDRESS": "127.0.0.1:9"}
    assert _bare(tmp_path, "db", "upgrade", **env).returncode == 0
    worker = one_line_usage_error(_bare(tmp_path, "worker", "--pool", "control", **env))
    assert worker.startswith("crewwork worker: CREWWORK_EVIDENCE_SIGNING_KEY_FILE: ") and "No such file" in worker
    dev = one_line_usage_error(_bare(tmp_path, "dev", "--data-dir", str(tmp_path / "dev"), **env))
    assert dev.startswith("crewwork dev: CREWWORK_EVIDENCE_SIGNING_KEY_FILE: "), dev
    assert not (tmp_path / "dev").exists(), "crewwork dev started something before refusing"
    config = _bare(tmp_path, "config", "--json", **env)
    assert config.returncode == 2 and json.loads(config.stdout), config.stderr
    assert "control pools will refuse to start: CREWWORK_EVIDENCE_SIGNING_KEY_FILE" in config.stderr
    # The other pools never read the key: they start as before (here: until Temporal, which is not there).
    with pytest.raises(Exception) as other:
        _bare(tmp_path, "worker", "--pool", "agent", **env)
    assert "EVIDENCE" not in str(other.value)


def test_a_required_bundle_without_a_key_is_a_start_up_error() -> None:
    errors = check_signing_key(EvidenceSettings(required=True)).errors
    assert len(errors) == 1 and "CREWWORK_EVIDENCE_REQUIRED" in errors[0]
    assert check_signing_key(EvidenceSettings()) == StartupCheck([], [])
