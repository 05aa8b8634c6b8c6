"""The repository map: which definitions of a repository matter most, cut to a token budget (as Aider's repo map).

1. **Index** (`build_index`, once per tenant registration and commit, cached on this host): the tags of every source
   file of the commit's tree (crewwork.codeintel.tags), read from the git directory the caller holds (a mirror, or
   a workspace's private git directory over it), never from a work tree, and parsed in a bounded worker process,
   never in this one (crewwork.codeintel.parsepool). Bounded: files, bytes per file, bytes held at once, depth and
   line length before a parse, time and memory of each parse, wall clock of the whole.
2. **Rank** (`rank`, pure): a graph of files, an edge A -> B for each name A references and B defines, weighted by
   how often (square root, so one file's hundred calls do not drown the rest), by how specific the name is (long
   names count more, names defined in many files and private `_names` less), PageRank over it (personalised towards
   the files the caller focuses on), and each file's rank shared out along its edges to the definitions it uses.
3. **Render** (`render`, pure): files in rank order with their highest-ranked definitions' first lines, stopping at
   the budget (tokens estimated as characters / 4).

Index cache: `<cache>/<registration id>/<commit>.json.gz`. The key is the tenant's own registration, never the URL:
two tenants with the same repository each build their own index (docs/sandbox.md, "Caches and tenants").
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import math
import os
import re
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from crewwork.codeintel.parsepool import ParseSession, Refusal
from crewwork.codeintel.tags import Definition, FileTags, language_of
from crewwork.config.codeintel import CodeIntelSettings
from crewwork.repos.gitproc import read_blobs
from crewwork.repos.trees import Entry, TreeError

INDEX_FORMAT = 1
MAX_DEFINERS = 50
"""A name defined in more files than this is too generic to rank by: it links nothing."""
MAX_RANK_EDGES = 250_000
"""(file, definition) links of the reference graph at most; the rest of a huge repository's references are not
followed (its map is still made, from the links kept)."""
PAGERANK_ITERATIONS = 30
BATCH_FILES = 200
BATCH_BYTES = 8 * 1024 * 1024
"""Source bytes held in this process at once while an index is built (a batch of blobs read from git)."""
CHARS_PER_TOKEN = 4
_SAFE_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


class IndexError_(RuntimeError):
    """An index could not be built within its bounds; the message says which."""


@dataclass
class RepoIndex:
    commit: str
    files: list[FileTags] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    """Why files were left out, with counts: `too_large`, `over_max_files`, and the parse refusals (`too_deep`,
    `line_too_long`, `parse_timeout`, `memory`, `parse_failed`: crewwork.codeintel.parsepool)."""
    seconds: float = 0.0

    def to_json(self) -> bytes:
        doc = {
            "format": INDEX_FORMAT,
            "commit": self.commit,
            "skipped": self.skipped,
            "seconds": self.seconds,
            "files": [asdict(f) for f in self.files],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> RepoIndex:
        doc = json.loads(raw)
        if doc.get("format") != INDEX_FORMAT:
            raise ValueError("index of another format")
        files = [
            FileTags(f["path"], f["language"], [Definition(**d) for d in f["definitions"]], dict(f["references"]))
            for f in doc["files"]
        ]
        return cls(doc["commit"], files, dict(doc.get("skipped", {})), float(doc.get("seconds", 0.0)))


# ---------------------------------------------------------------------------------------------- building


def source_files(entries: Iterable[Entry], settings: CodeIntelSettings) -> tuple[list[Entry], dict[str, int]]:
    """The files an index parses (a language crewwork indexes, small enough, not links), and what was left out."""
    chosen: list[Entry] = []
    skipped: dict[str, int] = defaultdict(int)
    for e in sorted(entries, key=lambda e: e.path):
        if not e.is_file or language_of(e.path) is None:
            continue
        if e.size is None or e.size > settings.max_file_bytes:
            skipped["too_large"] += 1
            continue
        if len(chosen) >= settings.max_files:
            skipped["over_max_files"] += 1
            continue
        chosen.append(e)
    return chosen, dict(skipped)


def _batches(files: list[Entry]) -> list[list[str]]:
    """Distinct blob ids in batches of at most BATCH_FILES blobs and BATCH_BYTES bytes (one blob may exceed it)."""
    out: list[list[str]] = [[]]
    size = 0
    seen: set[str] = set()
    for e in files:
        if e.sha in seen:
            continue
        seen.add(e.sha)
        if out[-1] and (len(out[-1]) >= BATCH_FILES or size + (e.size or 0) > BATCH_BYTES):
            out.append([])
            size = 0
        out[-1].append(e.sha)
        size += e.size or 0
    return [b for b in out if b]


async def build_index(
    git_dir: Path, commit: str, entries: Iterable[Entry], settings: CodeIntelSettings, *, scope: str
) -> RepoIndex:
    """Parse the commit's source files (read from `git_dir` in batches, parsed by a worker process, never here:
    crewwork.codeintel.parsepool). A file the parse refuses is left out and counted; IndexError_ past
    `index_timeout_s`: an index is whole or absent, never cut silently."""
    started = time.monotonic()
    files, skipped = source_files(entries, settings)
    index = RepoIndex(commit, skipped=skipped)
    by_sha: dict[str, list[str]] = defaultdict(list)
    for e in files:
        by_sha[e.sha].append(e.path)

    async def work() -> None:
        async with ParseSession(settings) as session:
            for batch in _batches(files):
                left = max(1.0, settings.index_timeout_s - (time.monotonic() - started))
                async for sha, data in read_blobs(git_dir, batch, timeout_s=left):
                    for path in by_sha[sha]:
                        result = await session.parse(scope, sha, path, data)
                        if isinstance(result, Refusal):
                            index.skipped[result.reason] = index.skipped.get(result.reason, 0) + 1
                        elif result is not None:
                            index.files.append(result)

    try:
        await asyncio.wait_for(work(), settings.index_timeout_s)
    except (TimeoutError, TreeError) as exc:
        raise IndexError_(
            f"indexing {commit[:12]} took longer than {settings.index_timeout_s:g} s "
            "(CREWWORK_CODEINTEL_INDEX_TIMEOUT_S)"
            if isinstance(exc, TimeoutError) or getattr(exc, "code", "") == "timeout"
            else f"indexing {commit[:12]} failed: {exc}"
        ) from None
    index.files.sort(key=lambda f: f.path)
    index.seconds = round(time.monotonic() - started, 3)
    return index


class IndexCache:
    """Indexes on this host's disk, one gzip'd JSON file per (registration, commit), bounded (LRU by access time)."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes

    def path(self, scope: str, commit: str) -> Path:
        if not _SAFE_KEY.fullmatch(scope) or not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit):
            raise ValueError("index keys are a registration id and a commit id")
        return self.root / scope / f"{commit}.json.gz"

    def get(self, scope: str, commit: str) -> RepoIndex | None:
        p = self.path(scope, commit)
        try:
            raw = gzip.decompress(p.read_bytes())
            index = RepoIndex.from_json(raw)
        except (OSError, ValueError, KeyError, TypeError, EOFError):
            return None
        with contextlib.suppress(OSError):
            os.utime(p)
        return index if index.commit == commit else None

    def put(self, scope: str, index: RepoIndex) -> None:
        p = self.path(scope, index.commit)
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = p.with_name(f".{p.name}.{uuid.uuid4().hex[:8]}")
        tmp.write_bytes(gzip.compress(index.to_json(), compresslevel=5))
        tmp.replace(p)
        self.evict()

    def evict(self) -> None:
        files = []
        for p in self.root.glob("*/*.json.gz"):
            with contextlib.suppress(OSError):
                st = p.stat()
                files.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in files)
        for _, size, p in sorted(files):
            if total <= self.max_bytes:
                break
            with contextlib.suppress(OSError):
                p.unlink()
                total -= size


_BUILDING: dict[tuple[str, str], asyncio.Future[RepoIndex]] = {}


async def cached_index(
    cache: IndexCache, scope: str, git_dir: Path, commit: str, entries: Iterable[Entry], settings: CodeIntelSettings
) -> tuple[RepoIndex, bool]:
    """(index, whether it came from the cache). Concurrent callers for one key in this process share one build."""
    found = await asyncio.to_thread(cache.get, scope, commit)
    if found is not None:
        return found, True
    key = (scope, commit)
    running = _BUILDING.get(key)
    if running is not None:
        return await asyncio.shield(running), False
    fut: asyncio.Future[RepoIndex] = asyncio.get_running_loop().create_future()
    _BUILDING[key] = fut
    try:
        index = await build_index(git_dir, commit, list(entries), settings, scope=scope)
        await asyncio.to_thread(cache.put, scope, index)
        fut.set_result(index)
        return index, False
    except BaseException as exc:
        fut.set_exception(exc)
        fut.exception()  # retrieved: a failed build with no other waiter is not an "unretrieved" error
        raise
    finally:
        _BUILDING.pop(key, None)


# ---------------------------------------------------------------------------------------------- ranking


@dataclass
class RankedDefinition:
    path: str
    definition: Definition
    rank: float


def rank(index: RepoIndex, focus: Iterable[str] = (), mentioned: Iterable[str] = ()) -> list[RankedDefinition]:
    """Every definition of the index with its rank, highest first (see the module's docstring).

    Bounded whatever the repository holds: a name defined in more than MAX_DEFINERS files links nothing (too generic
    to rank by), the graph keeps at most MAX_RANK_EDGES (file, definition) links (files in path order), and PageRank
    runs at most PAGERANK_ITERATIONS rounds over the links merged per pair of files. Pure Python: callers in a
    serving process run it in a thread (it gives the interpreter lock back every few milliseconds), so the event loop
    keeps answering meanwhile."""
    defines: dict[str, set[str]] = defaultdict(set)
    for f in index.files:
        for d in f.definitions:
            defines[d.name].add(f.path)
    paths = [f.path for f in index.files]
    if not paths:
        return []
    at = {p: i for i, p in enumerate(paths)}
    mentioned_names = set(mentioned)
    links: list[tuple[int, int, str, float]] = []  # (src, dst, name, weight)
    for f in index.files:
        if len(links) >= MAX_RANK_EDGES:
            break
        src = at[f.path]
        for name, count in f.references.items():
            owners = defines.get(name)
            if not owners or len(owners) > MAX_DEFINERS:
                continue
            weight = _name_weight(name, len(owners), name in mentioned_names) * math.sqrt(count)
            links.extend((src, at[dst], name, weight) for dst in owners)
    del links[MAX_RANK_EDGES:]
    focus_set = {p for p in focus if p in at}
    personal = [100.0 if p in focus_set else 1.0 for p in paths]
    out_weight = [0.0] * len(paths)
    for src, _dst, _name, w in links:
        out_weight[src] += w
    ranks = _pagerank(len(paths), links, out_weight, personal)
    scores: dict[tuple[int, str], float] = defaultdict(float)
    for src, dst, name, w in links:
        scores[(dst, name)] += ranks[src] * w / (out_weight[src] or 1.0)
    ranked: list[RankedDefinition] = []
    for f in index.files:
        i = at[f.path]
        bonus = 10.0 if f.path in focus_set else 1.0
        for d in f.definitions:
            ranked.append(RankedDefinition(f.path, d, scores.get((i, d.name), 0.0) * bonus + ranks[i] * 1e-3))
    ranked.sort(key=lambda r: (-r.rank, r.path, r.definition.line))
    return ranked


def _name_weight(name: str, defined_in: int, mentioned: bool) -> float:
    w = 1.0
    if mentioned:
        w *= 10.0
    if len(name) >= 8 and ("_" in name or any(c.isupper() for c in name[1:])):
        w *= 10.0
    if name.startswith("_"):
        w *= 0.1
    if defined_in > 5:
        w *= 0.1
    return w


def _pagerank(
    n: int,
    links: list[tuple[int, int, str, float]],
    out_weight: list[float],
    personal: list[float],
    damping: float = 0.85,
) -> list[float]:
    """Personalised PageRank over the links merged per (src, dst) pair, stopped once it moves less than 1e-6."""
    total_p = sum(personal)
    p = [x / total_p for x in personal]
    merged: dict[tuple[int, int], float] = defaultdict(float)
    for src, dst, _name, w in links:
        merged[(src, dst)] += w / out_weight[src]
    srcs = [s for s, _ in merged]
    dsts = [d for _, d in merged]
    shares = list(merged.values())
    dangling_nodes = [i for i in range(n) if out_weight[i] == 0]
    r = list(p)
    for _ in range(PAGERANK_ITERATIONS):
        dangling = sum(r[i] for i in dangling_nodes)
        nxt = [(1 - damping) * p[i] + damping * dangling * p[i] for i in range(n)]
        for s, d, share in zip(srcs, dsts, shares, strict=True):
            nxt[d] += damping * r[s] * share
        moved = sum(abs(a - b) for a, b in zip(nxt, r, strict=True))
        r = nxt
        if moved < 1e-6:
            break
    return r


# ---------------------------------------------------------------------------------------------- rendering


@dataclass
class RepoMap:
    text: str
    tokens: int
    files: int
    definitions: int
    total_definitions: int


def render(ranked: list[RankedDefinition], max_tokens: int) -> RepoMap:
    """Files in the order of their best definition, each with its chosen definitions by line, within the budget."""
    budget = max_tokens * CHARS_PER_TOKEN
    chosen: dict[str, list[Definition]] = {}
    order: list[str] = []
    used = 0
    count = 0
    for r in ranked:
        line = f"{r.definition.line:>5}│{r.definition.text}\n"
        cost = len(line) + (0 if r.path in chosen else len(r.path) + 2)
        if used + cost > budget:
            continue
        if r.path not in chosen:
            chosen[r.path] = []
            order.append(r.path)
        chosen[r.path].append(r.definition)
        used += cost
        count += 1
    parts = []
    for path in order:
        lines = "".join(f"{d.line:>5}│{d.text}\n" for d in sorted(chosen[path], key=lambda d: d.line))
        parts.append(f"{path}:\n{lines}")
    text = "".join(parts)
    return RepoMap(text, (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN, len(order), count, len(ranked))


def find(
    index: RepoIndex, name: str, *, prefix: bool = False, limit: int = 50
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Definitions of `name` (exact, or names starting with it when `prefix`; case-sensitive) and the files that
    reference it, most references first."""
    defs: list[dict[str, object]] = []
    names: set[str] = set()
    for f in index.files:
        for d in f.definitions:
            if d.name == name or (prefix and d.name.startswith(name)):
                defs.append({"name": d.name, "kind": d.kind, "path": f.path, "line": d.line, "text": d.text})
                names.add(d.name)
    names = names or {name}
    counted = [(sum(f.references.get(x, 0) for x in names), f.path) for f in index.files]
    refs: list[dict[str, object]] = [
        {"path": p, "count": n} for n, p in sorted(counted, key=lambda c: (-c[0], c[1])) if n
    ]
    return defs[:limit], refs[:limit]
