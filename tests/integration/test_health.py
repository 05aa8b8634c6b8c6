"""Readiness: /healthz answers 503 (with the reason) until the database and Temporal are both reachable."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from crewwork.api.app import create_app
from crewwork.config import Settings


def test_healthz_is_503_while_temporal_is_unreachable(tmp_path: Path, sqlite_url: str) -> None:
    settings = Settings(data_dir=tmp_path, database_url=sqlite_url, temporal_address="127.0.0.1:9")
    with TestClient(create_app(settings)) as client:
        r = client.get("/healthz")
        assert r.status_code == 503
        assert r.json() == {"ok": False, "database": True, "temporal": False, "version": r.json()["version"]}
