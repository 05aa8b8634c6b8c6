"""The built-in scanners' runner, executed INSIDE the validation sandbox (never imported by the host): it scans the
files a manifest names with detect-secrets and Bandit and writes one SARIF 2.1.0 log.

Run as `python3 -I crewwork_scan.py MANIFEST` from the read-only scanner kit (crewwork/steps/validate/scankit.py);
`-I` keeps the workspace and PYTHON* variables off `sys.path`, and the kit's own `site` directory is put first, so
a repository's files cannot shadow the scanners. The manifest (JSON, written by the host) says:

    {"after": [paths], "base_root": ".crewwork/scan/base", "base": [paths], "tools": ["secrets", "bandit"],
     "out": ".crewwork/scan/out.sarif", "max_results": 5000}

Paths are relative to the working directory (the workspace); the base copies live under `base_root` and are
reported under their own path with `properties.tree = "base"`. Inline suppressions (`# nosec`,
`pragma: allowlist secret`) are ignored: the change being judged could add them.
Standard library plus the kit's packages only.
"""

import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "site"))

LEVELS = {"HIGH": "error", "MEDIUM": "warning", "LOW": "note", "UNDEFINED": "note"}


def line_of(path, lineno):
    try:
        with open(path, "rb") as f:
            for i, raw in enumerate(f, 1):
                if i == lineno:
                    return raw.decode("utf-8", "replace").strip()[:400]
    except OSError:
        pass
    return ""


def location(rel, line):
    return {"physicalLocation": {"artifactLocation": {"uri": rel}, "region": {"startLine": max(1, int(line or 1))}}}


def scan_secrets(files):
    """(results, notifications) of detect-secrets over `files` [(disk path, reported path, tree)]."""
    from detect_secrets.core.scan import scan_file
    from detect_secrets.settings import default_settings

    results, notes, rules = [], [], {}
    with default_settings() as settings:
        settings.disable_filters("detect_secrets.filters.allowlist.is_line_allowlisted")
        for disk, rel, tree in files:
            try:
                found = list(scan_file(disk))
            except Exception as exc:  # one unreadable file is a note, not a failed scanner
                notes.append({"level": "warning", "message": {"text": f"{rel}: {type(exc).__name__}: {exc}"[:500]}})
                continue
            for s in found:
                rules[s.type] = {"id": s.type, "shortDescription": {"text": f"{s.type} in the source"}}
                results.append(
                    {
                        "ruleId": s.type,
                        "level": "error",
                        "message": {"text": f"{s.type} added to the source"},
                        "locations": [location(rel, s.line_number)],
                        "partialFingerprints": {"crewwork/v1": f"{s.type}:{s.secret_hash}"},
                        "properties": {"tree": tree},
                    }
                )
    return results, notes, list(rules.values())


def scan_bandit(files):
    from bandit.core import config, manager

    by_disk = {disk: (rel, tree) for disk, rel, tree in files if disk.endswith(".py")}
    if not by_disk:
        return [], [], []
    mgr = manager.BanditManager(config.BanditConfig(), "file", ignore_nosec=True, quiet=True)
    mgr.discover_files(sorted(by_disk), False)
    mgr.run_tests()
    results, notes, rules = [], [], {}
    for name, why in mgr.skipped:
        rel = by_disk.get(os.path.normpath(name), (name, ""))[0]
        notes.append({"level": "warning", "message": {"text": f"{rel}: not scanned: {why}"[:500]}})
    for issue in mgr.get_issue_list():
        disk = os.path.normpath(issue.fname)
        if disk not in by_disk:
            continue
        rel, tree = by_disk[disk]
        text = line_of(disk, issue.lineno)
        rules[issue.test_id] = {"id": issue.test_id, "name": issue.test, "shortDescription": {"text": issue.test}}
        digest = hashlib.sha256(" ".join(text.split()).encode()).hexdigest()[:16]
        results.append(
            {
                "ruleId": issue.test_id,
                "level": LEVELS.get(issue.severity, "warning"),
                "message": {"text": issue.text},
                "locations": [location(rel, issue.lineno)],
                "partialFingerprints": {"crewwork/v1": f"{issue.test_id}:{digest}"},
                "properties": {
                    "tree": tree,
                    "severity": issue.severity.lower(),
                    "confidence": issue.confidence.lower(),
                },
            }
        )
    return results, notes, list(rules.values())


def version(dist):
    try:
        from importlib.metadata import version as v

        return v(dist)
    except Exception:
        return None


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        manifest = json.load(f)
    base_root = manifest.get("base_root", "")
    files = [(os.path.normpath(p), p, "after") for p in manifest.get("after", [])]
    files += [(os.path.normpath(os.path.join(base_root, p)), p, "base") for p in manifest.get("base", [])]
    limit = int(manifest.get("max_results", 5000))
    runs = []
    for tool, fn, dist, uri in (
        ("secrets", scan_secrets, "detect-secrets", "https://github.com/Yelp/detect-secrets"),
        ("bandit", scan_bandit, "bandit", "https://github.com/PyCQA/bandit"),
    ):
        if tool not in manifest.get("tools", []):
            continue
        ok, results, notes, rules = True, [], [], []
        try:
            results, notes, rules = fn(files)
        except Exception as exc:
            ok = False
            notes = [{"level": "error", "message": {"text": f"{type(exc).__name__}: {exc}"[:1000]}}]
        truncated = max(0, len(results) - limit)
        runs.append(
            {
                "tool": {
                    "driver": {"name": tool, "version": version(dist), "informationUri": uri, "rules": rules[:limit]}
                },
                "invocations": [{"executionSuccessful": ok, "toolExecutionNotifications": notes[:100]}],
                "results": results[:limit],
                "properties": {"crewwork/truncated": truncated},
            }
        )
    log = {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0", "runs": runs}
    out = manifest["out"]
    with open(out + ".tmp", "w", encoding="utf-8") as f:
        json.dump(log, f)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
