"""Checking the digests a verified statement names (rule 6 of crewwork/attestation/verify.py): files by sha256 from
a directory or the bundle (plain names only, never following a link), `git:commit`/`git:tree` against a repository."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from crewwork.attestation.canonical import StrictJSONError, strict_loads
from crewwork.attestation.format import (
    COMMIT_SUBJECT,
    ENVIRONMENT_FILE,
    FILE_NAME,
    GIT_ID,
    HEX64,
    MAX_FILE_BYTES,
    MAX_JSON_DEPTH,
    MAX_SUBJECTS,
    PREDICATE_NAMES,
    PROVENANCE,
    SANDBOX_FILE,
    TEST_RESULT,
    TREE_SUBJECT,
)
from crewwork.attestation.report import Report, Verified, safe
from crewwork.attestation.treedigest import TreeDigestError, commit_info, git, tree_digest


def _b64(value: Any) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    # One encoding per value: a non-canonical encoding (stray padding bits) is refused.
    return raw if base64.b64encode(raw).decode() == value else None


# ------------------------------------------------------------------------------------------------ the subjects


def _descriptors(statements: dict[str, Verified], report: Report) -> dict[str, dict[str, str]]:
    """name -> digest of every digest-bearing descriptor the verified statements name (one digest per name)."""
    found: dict[str, dict[str, str]] = {}
    for v in statements.values():
        rds: list[Any] = list(v.statement["subject"])
        if v.type == TEST_RESULT:
            rds += v.predicate.get("configuration") or []
        if v.type == PROVENANCE:
            rds += [
                d for d in v.predicate["buildDefinition"].get("resolvedDependencies") or [] if d.get("name") != "base"
            ]
        if len(rds) > MAX_SUBJECTS:
            report.problem(f"the {PREDICATE_NAMES[v.type]} names more than {MAX_SUBJECTS} subjects")
            continue
        for rd in rds:
            name, digest = rd.get("name"), rd.get("digest") or {}
            if not digest:
                continue
            if not isinstance(name, str) or (name not in (COMMIT_SUBJECT, TREE_SUBJECT) and not FILE_NAME.match(name)):
                report.problem(f"subject name {safe(name, 120)!r} is not a plain file name; it is never looked up")
                continue
            if name in found and found[name] != dict(digest):
                report.problem(f"subject {name} has two different digests in the bundle's statements")
                continue
            found[name] = dict(digest)
    return found


def _subjects(
    doc: dict[str, Any],
    statements: dict[str, Verified],
    report: Report,
    *,
    repo: Path | None,
    files_dir: Path | None,
    commit: str | None,
    allow_unchecked: bool,
) -> None:
    found = _descriptors(statements, report)
    files: dict[str, Any] = doc["files"]
    for name in sorted(set(files) - set(found)):
        report.problem(f"file {safe(name, 120)} in the bundle is named by no signed statement")
    prov = statements[PROVENANCE].predicate["buildDefinition"]
    base = next(
        (d for d in prov.get("resolvedDependencies") or [] if isinstance(d, dict) and d.get("name") == "base"), {}
    )
    base_commit = (base.get("digest") or {}).get("gitCommit")
    report.proven["change"] = {
        "repo": str(base.get("uri", "")),
        "base_commit": base_commit,
        "branch": (prov.get("internalParameters") or {}).get("deliveryBranch"),
    }
    # Files.
    contents: dict[str, bytes] = {}
    for name, digest in found.items():
        if name in (COMMIT_SUBJECT, TREE_SUBJECT):
            continue
        want = digest.get("sha256")
        if not isinstance(want, str) or not HEX64.match(want):
            report.problem(f"subject {name}: no sha256 digest to check")
            continue
        found_file, whence = _file(name, files.get(name), files_dir, keep=name in JSON_SUBJECTS)
        if found_file is None:
            _unchecked(report, name, whence, allow_unchecked)
            continue
        got, size, data = found_file
        if got != want:
            report.problem(f"subject {name}: the {whence}'s sha256 is {got}, the signed statement says {want}")
            continue
        entry = files.get(name)
        if isinstance(entry, dict) and entry.get("size") != size:
            report.problem(f"subject {name}: the bundle says {entry.get('size')} bytes, the {whence} has {size}")
            continue
        if data is not None:
            contents[name] = data
        report.checked.append(name)
    # Git objects.
    if COMMIT_SUBJECT in found or TREE_SUBJECT in found:
        _git_subjects(found, base_commit, report, repo=repo, commit=commit, allow_unchecked=allow_unchecked)
    elif commit is not None:
        report.problem(f"--commit {safe(commit)}: this bundle is about one attempt's diff, not a landed commit")
    for key, name in (("sandbox", SANDBOX_FILE), ("environment", ENVIRONMENT_FILE)):
        if name in contents:
            try:
                value = strict_loads(contents[name], max_depth=MAX_JSON_DEPTH)
                report.proven[key] = value if isinstance(value, dict) else None
            except StrictJSONError:
                report.problem(f"subject {name} matches its digest but is not JSON")


def _unchecked(report: Report, name: str, why: str, allow: bool) -> None:
    report.unchecked.append(name)
    if not allow:
        report.problem(f"subject {name} was not checked: {why} (--allow-unchecked accepts that)")


JSON_SUBJECTS = (SANDBOX_FILE, ENVIRONMENT_FILE)
"""The subject files read after they are checked (what the report says about the sandbox and the environment); every
other file is only hashed, as it is read."""
MAX_JSON_SUBJECT_BYTES = 16 * 1024 * 1024

Found = tuple[str, int, bytes | None]
"""(sha256, size, the bytes when kept) of a subject file."""


def _file(name: str, entry: Any, files_dir: Path | None, *, keep: bool) -> tuple[Found | None, str]:
    """A subject file's digest, size and (with `keep`) bytes, and where they came from; or None and why not."""
    if files_dir is not None:
        found, why = read_subject_file(files_dir, name, keep=keep)
        if found is not None:
            return found, f"file {files_dir / name}"
        if why != "absent":
            return None, why
    if isinstance(entry, dict) and "base64" in entry:
        raw = _b64(entry["base64"])
        if raw is None:
            return None, "its embedded copy is not canonical base64"
        return (hashlib.sha256(raw).hexdigest(), len(raw), raw if keep else None), "embedded copy"
    if isinstance(entry, dict) and entry.get("artifact"):
        return None, (
            f"it is not in the bundle (artifact {safe(entry['artifact'], 80)}: download it with `crewwork artifacts "
            f"ITEM {safe(entry['artifact'], 80)} -o DIR/{name}` and give --files DIR)"
        )
    return None, "it is not in the bundle and no --files directory holds it"


def read_subject_file(directory: Path, name: str, *, keep: bool = True) -> tuple[Found | None, str]:
    """`directory/name` if it is a regular file (no link followed, `name` a plain file name), hashed as it is read
    (1 MiB at a time) up to MAX_FILE_BYTES; its bytes are kept only with `keep`, and then up to
    MAX_JSON_SUBJECT_BYTES. Returns ((sha256, size, bytes or None), "") or (None, why); why is "absent" when there is
    no such file."""
    if not FILE_NAME.match(name):
        return None, f"{name!r} is not a plain file name"
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        return None, f"--files {directory}: {exc.strerror}"
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    except FileNotFoundError:
        return None, "absent"
    except OSError as exc:
        return None, f"{directory / name}: {exc.strerror} (links are not followed)"
    finally:
        os.close(dfd)
    limit = MAX_JSON_SUBJECT_BYTES if keep else MAX_FILE_BYTES
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"{directory / name} is not a regular file"
        if st.st_size > limit:
            return None, f"{directory / name} is larger than {limit} bytes"
        digest, chunks, total = hashlib.sha256(), [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > limit:
                return None, f"{directory / name} grew past {limit} bytes while read"
            digest.update(chunk)
            if keep:
                chunks.append(chunk)
        return (digest.hexdigest(), total, b"".join(chunks) if keep else None), ""
    finally:
        os.close(fd)


def git_dir_of(repo: Path) -> Path:
    """The git directory of a work tree or bare repository, found without running anything the repository names."""
    if (repo / ".git").is_dir():
        return repo / ".git"
    if (repo / ".git").is_file():
        line = (repo / ".git").read_text(errors="replace").strip()
        if line.startswith("gitdir: "):
            target = Path(line[8:])
            return target if target.is_absolute() else (repo / target)
    if (repo / "objects").is_dir() and (repo / "HEAD").is_file():
        return repo
    raise TreeDigestError(f"{repo} is not a git repository (no .git, not bare)")


def _git_subjects(
    found: dict[str, dict[str, str]],
    base_commit: str | None,
    report: Report,
    *,
    repo: Path | None,
    commit: str | None,
    allow_unchecked: bool,
) -> None:
    want_commit = found.get(COMMIT_SUBJECT, {}).get("gitCommit")
    tree = found.get(TREE_SUBJECT, {})
    if not (isinstance(want_commit, str) and GIT_ID.match(want_commit)):
        report.problem("the landed change names no commit (git:commit with a gitCommit digest)")
        return
    if not (
        isinstance(tree.get("gitTree"), str) and GIT_ID.match(tree["gitTree"]) and HEX64.match(tree.get("sha256", ""))
    ):
        report.problem("the landed change names no tree (git:tree with gitTree and sha256 digests)")
        return
    report.proven["change"].update(commit=want_commit, tree=tree["gitTree"])
    if repo is None:
        if commit is not None:
            report.problem("--commit needs --repo: a commit is resolved in a repository")
        for name in (COMMIT_SUBJECT, TREE_SUBJECT):
            _unchecked(report, name, "no --repo given", allow_unchecked)
        return
    try:
        gd = git_dir_of(repo)
        if commit is not None:
            expected = (
                git(gd, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{commit}^{{commit}}").decode().strip()
            )
            if expected != want_commit:
                report.problem(
                    f"--commit {safe(commit)} is {expected}; the bundle is about {want_commit} (a bundle of another change)"
                )
                return
        got_tree, parents, _when = commit_info(gd, want_commit)
    except (TreeDigestError, OSError) as exc:
        report.problem(f"git:commit {want_commit} cannot be read in {repo}: {exc}")
        return
    if got_tree != tree["gitTree"]:
        report.problem(f"git:commit {want_commit} has tree {got_tree or '?'}; the statement says {tree['gitTree']}")
        return
    if parents != [base_commit]:
        report.problem(f"git:commit {want_commit} has parents {parents}; the provenance says its base is {base_commit}")
        return
    report.checked.append(COMMIT_SUBJECT)
    try:
        digest = tree_digest(gd, want_commit)
    except TreeDigestError as exc:
        report.problem(f"git:tree of {want_commit} cannot be read: {exc}")
        return
    if digest.sha256 != tree["sha256"]:
        report.problem(f"git:tree: the content's tree digest is {digest.sha256}, the statement says {tree['sha256']}")
        return
    report.checked.append(TREE_SUBJECT)
