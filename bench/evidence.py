"""Signed evidence bundles on a real repository: signing and verification time per bundle, and bundle size.

Work items on toolz 1.0.0 (rebuilt from its sdist with a planted bug, tests/repos/pkgindex.py), served by `git daemon`
on loopback, its environment a venv with pytest from a loopback package index, land through the real stack (Temporal
dev server, in-process pools, bwrap, SQLite) with an evidence signing key configured: the scripted agent restores
the upstream code, toolz's own suite (~170 tests) validates it, and land_change signs the bundle and pushes it as a git
note. Then, for each landed item, side by side in one run:

- **sign, whole**: what land_change adds (`Publisher.landed_bundle`: gather the facts from the store, the crewwork tree
  digest of the landed commit in the mirror, build and check the statements, sign three envelopes), and its parts;
- **verify, whole**: `verify_bundle` against the served repository (signatures, statements, every embedded subject,
  the commit, its parent and the tree digest), and without the repository (signatures and files only);
- **crewwork verify**: the CLI as a process (Python start-up included);
- **size**: the bundle, gzipped, and its parts.

    .venv/bin/python bench/evidence.py [--items 3] [--rounds 20] [--dump DIR]

`--dump DIR` keeps one item's bundle, its statements decoded, the published keys and `crewwork verify`'s output.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gzip
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import bench_settings, dev_server, in_process_pools, table, write_results  # noqa: E402
from crewwork import __version__  # noqa: E402
from crewwork.attestation.facts import ReviewFact  # noqa: E402
from crewwork.attestation.format import run_url  # noqa: E402
from crewwork.attestation.gather import gather  # noqa: E402
from crewwork.attestation.keys import generate, load_signer, load_trusted  # noqa: E402
from crewwork.attestation.publish import BUNDLE_ARTIFACT, Publisher, landed_fact  # noqa: E402
from crewwork.attestation.sign import sign_bundle  # noqa: E402
from crewwork.attestation.treedigest import tree_digest  # noqa: E402
from crewwork.attestation.verify import verify_bundle  # noqa: E402
from crewwork.config.attestation import EvidenceSettings  # noqa: E402
from crewwork.models import WorkItemResult, WorkItemSpec  # noqa: E402
from crewwork.repos.worker import Repositories  # noqa: E402
from crewwork.store.db import upgrade  # noqa: E402

PYTHON = "/usr/bin/python3"
NO_REVIEW = ReviewFact(required=False)
"""What land_change states for an item that did not ask for review (these items do not)."""
COMMAND = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=.crewwork/junit.xml", "toolz/tests"]


def prerequisites() -> list[str]:
    from crewwork.sandbox.bwrap import BwrapSandbox
    from tests.repos.pkgindex import packages_ready

    problems = []
    ok, why = BwrapSandbox.available()
    if not ok:
        problems.append(f"bwrap sandbox: {why}")
    ok, why = packages_ready()
    if not ok:
        problems.append(why)
    return problems


def spec(url: str, index_url: str, fixed: str, n: int) -> WorkItemSpec:
    from tests.repos.pkgindex import TOOLZ_FILE

    return WorkItemSpec.model_validate(
        {
            "kind": "code_change",
            "repo": {"url": url, "ref": "main"},
            "instruction": f"frequencies() counts every item twice; fix it (item {n})",
            "environment": {
                "python": PYTHON,
                "setup": [
                    [
                        "python",
                        "-m",
                        "pip",
                        "install",
                        "--no-cache-dir",
                        "-q",
                        "--index-url",
                        index_url,
                        "pytest==8.3.5",
                    ]
                ],
                "network": True,
            },
            "validation": {
                "command": COMMAND,
                "junit_path": ".crewwork/junit.xml",
                "timeout_s": 300,
                "fail_to_pass": ["toolz/tests/test_itertoolz.py::test_frequencies"],
            },
            "agent": {"name": "scripted", "config": {"attempts": [{"files": {TOOLZ_FILE: fixed}}]}},
            "sandbox": {"backend": "bwrap"},
        }
    )


async def timed(fn: Callable[[], Awaitable[Any]], rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t)
    return out


def stats(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs) * 1000, xs[min(len(xs) - 1, int(len(xs) * 0.9))] * 1000


async def run(items: int, rounds: int, dump: Path | None) -> dict[str, Any]:
    from tests.repos.pkgindex import PackageIndex, toolz_repo
    from tests.repos.servers import GitDaemon, bare_from

    tmp = Path(tempfile.mkdtemp(prefix="crewwork-evidence-bench-"))
    try:
        work, upstream = toolz_repo(tmp / "toolz")
        bare = bare_from(work, tmp / "served" / "oss" / "toolz.git")
        key = tmp / "evidence.key"
        public = generate(key)
        (tmp / "keys.json").write_text(json.dumps({"keys": [public.document()]}))
        keys = load_trusted([tmp / "keys.json"])
        signer = load_signer(key, None)
        assert signer is not None
        db = f"sqlite+aiosqlite:///{tmp / 'crewwork.db'}"
        await upgrade(db)
        landed: list[tuple[str, str, bytes]] = []
        with (
            PackageIndex(tmp / "index") as index,
            GitDaemon(tmp / "served", tmp / "daemon.log") as daemon,
            dev_server(tmp / "temporal", memory=True) as temporal,
        ):
            url = daemon.url("oss/toolz.git")
            evidence = EvidenceSettings(signing_key_file=key, builder_id="https://crewwork.bench/toolz")
            settings = bench_settings(
                tmp / "data",
                temporal,
                db,
                sandbox_backend="bwrap",
                setup_network_allowlist=index.hostport,
                evidence=evidence,
            )
            async with in_process_pools(settings) as (service, store, tenant):
                land_s = []
                for n in range(items):
                    t = time.perf_counter()
                    res = await service.submit(tenant, spec(url, index.url, upstream, n))
                    handle = service.client.get_workflow_handle(res.row.workflow_id, result_type=WorkItemResult)
                    result = await asyncio.wait_for(handle.result(), 900)
                    land_s.append(time.perf_counter() - t)
                    if result.state != "succeeded":
                        raise SystemExit(f"item {n} ended {result.state}: {result.reason}")
                    arts = [a for a in await store.list_artifacts(res.row.id) if a.name == BUNDLE_ARTIFACT]
                    bundle = await store.artifact_content(arts[-1].id) or b""
                    landed.append((res.row.id, result.landed_commit or "", bundle))
                    print(
                        f"item {n + 1}/{items}: {res.row.id} landed {result.landed_commit} in {land_s[-1]:.1f} s, "
                        f"bundle {len(bundle)} bytes",
                        file=sys.stderr,
                    )
                repos = Repositories(settings)
                publisher = Publisher(evidence)
                rows = []
                per_item: list[dict[str, Any]] = []
                for wid, commit, bundle in landed:
                    hold = await repos.hold(url, commit)
                    try:
                        gitdir = hold.gitdir
                        branch = f"crewwork/{wid}"
                        review = NO_REVIEW
                        fact = landed_fact(gitdir, commit, branch)
                        facts = await gather(store, wid, 1, landed=fact, review=review)

                        async def whole(
                            gitdir: Path = gitdir, wid: str = wid, commit: str = commit, branch: str = branch
                        ) -> None:
                            await publisher.landed_bundle(
                                store,
                                gitdir=gitdir,
                                work_item_id=wid,
                                attempt=1,
                                commit=commit,
                                branch=branch,
                                review=NO_REVIEW,
                            )

                        async def gathering(wid: str = wid, fact: Any = fact) -> None:
                            await gather(store, wid, 1, landed=fact, review=NO_REVIEW)

                        async def digest(gitdir: Path = gitdir, commit: str = commit) -> None:
                            tree_digest(gitdir, commit)

                        async def signing(facts: Any = facts) -> None:
                            sign_bundle(
                                facts,
                                [signer],
                                builder_id=evidence.builder_id,
                                version=__version__,
                                url=run_url(facts.work_item_id, facts.attempt),
                            )

                        resigned = sign_bundle(
                            facts,
                            [signer],
                            builder_id=evidence.builder_id,
                            version=__version__,
                            url=run_url(facts.work_item_id, facts.attempt),
                            embed_max_bytes=evidence.embed_max_bytes,
                        )
                        timings = {
                            "sign, whole": await timed(whole, rounds),
                            "  gather facts (store)": await timed(gathering, rounds),
                            "  tree digest (mirror)": await timed(digest, rounds),
                            "  statements + 3 signatures": await timed(signing, rounds),
                        }
                    finally:
                        hold.release()

                    async def verify_repo(bundle: bytes = bundle, wid: str = wid, commit: str = commit) -> None:
                        r = verify_bundle(bundle, keys, repo=bare, work_item=wid, commit=commit)
                        assert r.ok, r.problems

                    async def verify_files(bundle: bytes = bundle) -> None:
                        r = verify_bundle(bundle, keys, allow_unchecked=True)
                        assert r.ok, r.problems

                    async def verify_digest(commit: str = commit) -> None:
                        tree_digest(bare, commit)

                    timings["verify, whole (--repo)"] = await timed(verify_repo, rounds)
                    timings["  without --repo"] = await timed(verify_files, rounds)
                    timings["  tree digest (clone)"] = await timed(verify_digest, rounds)
                    path = tmp / f"{wid}.json"
                    path.write_bytes(bundle)
                    cli = []
                    for _ in range(3):
                        t = time.perf_counter()
                        p = subprocess.run(
                            [
                                str(Path(sys.executable).parent / "crewwork"),
                                "verify",
                                str(path),
                                "--repo",
                                str(bare),
                                "--key",
                                str(tmp / "keys.json"),
                                "--commit",
                                commit,
                            ],
                            capture_output=True,
                            text=True,
                        )
                        cli.append(time.perf_counter() - t)
                        assert p.returncode == 0, p.stdout + p.stderr
                    timings["crewwork verify (process)"] = cli
                    d = json.loads(bundle)
                    payloads = [len(base64.b64decode(e["payload"])) for e in d["envelopes"]]
                    files = {k: v["size"] for k, v in d["files"].items()}
                    sizes = {
                        "bundle_bytes": len(bundle),
                        "gzip_bytes": len(gzip.compress(bundle, 9)),
                        "statement_bytes": payloads,
                        "embedded_file_bytes": files,
                        "same_bytes_when_signed_again": resigned == bundle,
                    }
                    per_item.append({"work_item": wid, "commit": commit, "timings_s": timings, "sizes": sizes})
                    for name, xs in timings.items():
                        med, p90 = stats(xs)
                        rows.append([wid[-8:], name, len(xs), med, p90])
                    if dump is not None and wid == landed[0][0]:
                        dump_item(dump, tmp, bare, path, wid, commit, d)
        print()
        print(table(["item", "step", "n", "median ms", "p90 ms"], rows))
        print()
        print(
            table(
                ["item", "bundle bytes", "gzip bytes", "statements (bytes)", "embedded files (bytes)", "deterministic"],
                [
                    [
                        p["work_item"][-8:],
                        p["sizes"]["bundle_bytes"],
                        p["sizes"]["gzip_bytes"],
                        " + ".join(str(x) for x in p["sizes"]["statement_bytes"]),
                        ", ".join(f"{k} {v}" for k, v in p["sizes"]["embedded_file_bytes"].items()),
                        p["sizes"]["same_bytes_when_signed_again"],
                    ]
                    for p in per_item
                ],
            )
        )
        return {"items": per_item, "landing_s": land_s, "rounds": rounds, "repository": "toolz 1.0.0 (sdist)"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def dump_item(dump: Path, tmp: Path, bare: Path, path: Path, wid: str, commit: str, d: dict[str, Any]) -> None:
    dump.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, dump / "bundle.json")
    shutil.copy(tmp / "keys.json", dump / "keys.json")
    statements = [json.loads(base64.b64decode(e["payload"])) for e in d["envelopes"]]
    (dump / "statements.json").write_text(json.dumps(statements, indent=2) + "\n")
    note = subprocess.run(
        ["git", "--git-dir", str(bare), "notes", f"--ref=crewwork/{wid}", "show", commit], capture_output=True
    ).stdout
    (dump / "note-matches-bundle.txt").write_text(str(note == path.read_bytes()) + "\n")
    if (dump / "repo.git").exists():
        shutil.rmtree(dump / "repo.git")
    shutil.copytree(bare, dump / "repo.git", symlinks=True)
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "crewwork"),
            "verify",
            str(dump / "bundle.json"),
            "--repo",
            str(dump / "repo.git"),
            "--key",
            str(dump / "keys.json"),
            "--commit",
            commit,
            "--work-item",
            wid,
        ],
        capture_output=True,
        text=True,
    )
    (dump / "verify.txt").write_text(
        f"$ crewwork verify bundle.json --repo repo.git --key keys.json --commit {commit} "
        f"--work-item {wid}\n{out.stdout}{out.stderr}exit {out.returncode}\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--dump", type=Path, help="keep the first item's bundle, statements and verify output here")
    args = ap.parse_args()
    problems = prerequisites()
    if problems:
        raise SystemExit("cannot run:\n  " + "\n  ".join(problems))
    data = asyncio.run(run(args.items, args.rounds, args.dump))
    write_results("evidence", data)


if __name__ == "__main__":
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    main()
