"""The model agent's prompt: which files of the workspace it shows the model, and the re-ask after an edit that
did not apply. Pure functions of the workspace and the agent's config (crewwork/agents/model.py runs the session)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from crewwork.agents.base import AgentContext
from crewwork.agents.edits import EditApplyError, EditError, resolve_in_workspace
from crewwork.agents.model_config import ModelAgentConfig
from crewwork.boundary.paths import is_dotgit

_PATH_TOKEN = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.[A-Za-z0-9]{1,8})(?![\w/-])")
_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", re.MULTILINE)

# ---------------------------------------------------------------------- prompt building


def build_prompt(
    ws: Path, ctx: AgentContext, cfg: ModelAgentConfig, repo_map: str | None = None
) -> tuple[str, set[str]]:
    """The first user message and the set of files whose contents it shows (and the repository map, when given,
    after the listing: crewwork.codeintel.prompt)."""
    listing = list_files(ws)
    pointers = "\n".join(t for t in (ctx.instruction, ctx.review_comment, ctx.diagnostics) if t)
    chosen = select_files(ws, listing, pointers, cfg)
    parts = [f"# Task\n{ctx.instruction or '(no instruction)'}"]
    if ctx.review_comment:
        parts.append(f"# Reviewer's request for changes\n{ctx.review_comment}")
    if ctx.diagnostics:
        parts.append(f"# Diagnostics from the previous attempt (attempt {ctx.attempt - 1})\n{ctx.diagnostics}")
    shown_listing = listing[: cfg.max_listing_entries]
    more = len(listing) - len(shown_listing)
    parts.append("# Repository files\n" + "\n".join(shown_listing) + (f"\n... and {more} more" if more > 0 else ""))
    if repo_map:
        parts.append(
            "# Repository map (the most referenced definitions at the base commit, by file and line)\n" + repo_map
        )
    budget = cfg.max_context_chars
    shown: set[str] = set()
    file_parts = []
    for rel in chosen:
        text = read_text(ws, rel)
        if text is None:
            continue
        body = text[: min(cfg.max_file_chars, budget)]
        if not body and text:
            break
        note = "" if len(body) == len(text) else f"\n[... truncated: {len(text) - len(body)} more characters]"
        file_parts.append(f"## {rel}\n```\n{body}{'' if body.endswith(chr(10)) else chr(10)}```{note}")
        shown.add(rel)
        budget -= len(body)
        if budget <= 0:
            break
    if file_parts:
        parts.append("# File contents\n" + "\n\n".join(file_parts))
    parts.append("Reply with SEARCH/REPLACE blocks that complete the task.")
    return "\n\n".join(parts), shown


def list_files(ws: Path) -> list[str]:
    """The workspace's files, repo-relative, sorted. Walked directly (never `git` in the workspace: host git
    does not run in one, see docs/sandbox.md); links are listed, never followed, and no `.git` entry counts."""
    files: list[str] = []
    for root, dirs, names in os.walk(ws):
        dirs[:] = sorted(d for d in dirs if not is_dotgit(d) and not (root == str(ws) and d == ".crewwork"))
        for n in names:
            if not is_dotgit(n):
                files.append(str(Path(root, n).relative_to(ws)))
    files.sort()
    return files


def select_files(ws: Path, listing: list[str], pointers: str, cfg: ModelAgentConfig) -> list[str]:
    """Files for the prompt: configured ones, ones the texts name, modules those import; else the listing."""
    known = set(listing)
    ws_prefix = str(ws.resolve()).rstrip("/") + "/"
    text = pointers.replace(ws_prefix, "").replace(str(ws).rstrip("/") + "/", "")
    chosen: list[str] = []

    def add(rel: str) -> None:
        if rel in known and rel not in chosen:
            chosen.append(rel)

    for rel in cfg.context_files:
        add(rel)
    for token in _PATH_TOKEN.findall(text):
        token = token.lstrip("./") if token.startswith("./") else token
        if token in known:
            add(token)
        else:
            for rel in listing:
                if rel.endswith("/" + token):
                    add(rel)
    for rel in list(chosen):
        if rel.endswith(".py"):
            for mod in _imports(ws, rel):
                for cand in (mod.replace(".", "/") + ".py", mod.replace(".", "/") + "/__init__.py"):
                    for k in listing:
                        if k == cand or k.endswith("/" + cand):
                            add(k)
    # With nothing named, show the first files of the listing (small repositories fit whole).
    candidates = chosen or listing
    out: list[str] = []
    for rel in candidates:
        if len(out) >= cfg.max_context_files:
            break
        if _is_texty(ws, rel):
            out.append(rel)
    return out


def _imports(ws: Path, rel: str) -> list[str]:
    text = read_text(ws, rel) or ""
    return [a or b for a, b in _IMPORT.findall(text)]


def _is_texty(ws: Path, rel: str) -> bool:
    try:
        path = resolve_in_workspace(ws, rel)
        with path.open("rb") as f:
            head = f.read(4096)
    except (OSError, EditApplyError):
        return False
    return b"\x00" not in head


def read_text(ws: Path, rel: str) -> str | None:
    try:
        return resolve_in_workspace(ws, rel).read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError, EditApplyError):
        return None


def _reask(ws: Path, error: EditError, shown: set[str], truncated: str, max_chars: int) -> str:
    msg = f"Your edit was not applied{truncated}: {error}\n"
    path = getattr(error, "path", None)
    if path and path not in shown:
        current = read_text(ws, path)
        if current is not None:
            msg += f"\nCurrent contents of {path}:\n```\n{current[:max_chars]}\n```\n"
            shown.add(path)
    msg += (
        "\nNo change from that reply was kept. Reply again with the complete set of SEARCH/REPLACE blocks, "
        "with SEARCH text copied exactly from the current files."
    )
    return msg
