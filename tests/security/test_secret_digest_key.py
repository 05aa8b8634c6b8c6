"""The key prepared environments digest setup secrets with (crewwork/sandbox/prepare.py, `secret_digests`): a random
key made on first use in the cache root. Every worker process of a host shares it.

- Made atomically: two workers asking for it at once on a fresh cache used to race between one creating the file and
  writing its 32 bytes: the other read an empty file and failed the validation with "damaged (remove it ...)", and a
  worker killed in that gap left an empty key that failed every later build with a secret until an operator removed
  it. The key is now written to a temporary file and linked into place, so it is complete or absent.
- Never followed, never someone else's: a symbolic link planted at its place is refused (not followed), and so is a key
  file another user owns or that others may read or write (with it, anyone holding an entry's key from evidence could
  test guesses of a secret).
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from crewwork.sandbox.envplan import DIGEST_KEY
from crewwork.sandbox.prepare import PreparedEnvCache

SECRETS = {"IDX_TOKEN": "token-of-tenant-a-7f3e91"}


def _digest(root: str, barrier: object, out: object) -> None:
    barrier.wait()  # type: ignore[attr-defined]
    try:
        out.put(("ok", PreparedEnvCache(Path(root)).secret_digests(SECRETS)["IDX_TOKEN"]))  # type: ignore[attr-defined]
    except OSError as exc:
        out.put(("error", str(exc)))  # type: ignore[attr-defined]


def test_workers_racing_for_a_fresh_cache_all_get_the_same_complete_key(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    for i in range(25):
        root = tmp_path / f"cache-{i}"
        root.mkdir()
        barrier, out = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_digest, args=(str(root), barrier, out)) for _ in range(4)]
        for p in procs:
            p.start()
        results = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(60)
        assert all(kind == "ok" for kind, _ in results), results
        assert len({d for _, d in results}) == 1, "one key per cache: every worker files a secret under one key"
        assert (root / DIGEST_KEY).stat().st_size == 32
        assert sorted(p.name for p in root.iterdir()) == [DIGEST_KEY], "no temporary file is left behind"


def test_a_key_file_left_without_its_bytes_is_never_made_by_a_worker(tmp_path: Path) -> None:
    """What a worker killed while making the key leaves: at most a temporary file, never a short key."""
    cache = PreparedEnvCache(tmp_path / "cache")
    (cache.root / f"{DIGEST_KEY}.0123abcd.tmp").write_bytes(b"")
    assert len(cache.secret_digests(SECRETS)) == 1
    assert (cache.root / DIGEST_KEY).stat().st_size == 32


def test_a_planted_link_is_refused_and_not_followed(tmp_path: Path) -> None:
    cache = PreparedEnvCache(tmp_path / "cache")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"k" * 32)
    (cache.root / DIGEST_KEY).symlink_to(elsewhere)
    with pytest.raises(OSError, match="symbolic link"):
        cache.secret_digests(SECRETS)
    assert elsewhere.read_bytes() == b"k" * 32


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o606])
def test_a_key_file_others_may_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    cache = PreparedEnvCache(tmp_path / "cache")
    cache.secret_digests(SECRETS)
    (cache.root / DIGEST_KEY).chmod(mode)
    with pytest.raises(OSError, match="nobody else"):
        cache.secret_digests(SECRETS)


def test_a_key_file_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file to another user")
    cache = PreparedEnvCache(tmp_path / "cache")
    cache.secret_digests(SECRETS)
    os.chown(cache.root / DIGEST_KEY, 65534, 65534)
    with pytest.raises(OSError, match="nobody else"):
        cache.secret_digests(SECRETS)
