"""What each recorded lifecycle costs Temporal, counted (no clock, so the figures are the same on any machine): for
every committed history of WorkItemWorkflow (tests/histories/, recorded from real runs by
tests/integration/test_replay.py), its history events, workflow tasks, activities scheduled, local-activity markers,
patch markers, search-attribute upserts and timers, and which patches it took.

A history is one lifecycle as a release ran it: compare the `_vN` files of the same scenario to see what a workflow
change saved (bench/trace.py counts the same per `task` item under load).

    .venv/bin/python bench/history_counts.py [--events NAME]   # --events: list one history's events in order
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import table

HISTORIES = Path(__file__).resolve().parents[1] / "tests" / "histories"
COLUMNS = [
    "history",
    "events",
    "workflow tasks",
    "activities",
    "local-activity markers",
    "patch markers",
    "upserts",
    "timers",
    "patches taken",
]


def load(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["events"])


def kind(event: dict[str, Any]) -> str:
    return str(event["eventType"]).removeprefix("EVENT_TYPE_")


def what(event: dict[str, Any]) -> str:
    """The event's type, and for an activity or a marker what it is (an activity's name, a patch's id)."""
    name = kind(event)
    if attrs := event.get("activityTaskScheduledEventAttributes"):
        return f"{name} {attrs['activityType']['name']}"
    if attrs := event.get("markerRecordedEventAttributes"):
        return f"{name} {attrs.get('markerName')} {', '.join(patches_of(event)) or local_activity_of(event)}"
    return name


def patches_of(event: dict[str, Any]) -> list[str]:
    attrs = event.get("markerRecordedEventAttributes") or {}
    if attrs.get("markerName") != "core_patch":
        return []
    return [json.loads(base64.b64decode(p["data"]))["id"] for p in attrs["details"]["patch-data"]["payloads"]]


def local_activity_of(event: dict[str, Any]) -> str:
    attrs = event.get("markerRecordedEventAttributes") or {}
    if attrs.get("markerName") != "core_local_activity":
        return ""
    for p in attrs["details"].get("data", {}).get("payloads", []):
        with_type = json.loads(base64.b64decode(p["data"]))
        if isinstance(with_type, dict) and "activity_type" in with_type:
            return str(with_type["activity_type"])
    return ""


def counts(path: Path) -> list[Any]:
    events = load(path)
    kinds = [kind(e) for e in events]
    markers = [e for e in events if kind(e) == "MARKER_RECORDED"]
    patches = sorted({p for e in markers for p in patches_of(e)})
    return [
        path.stem,
        len(events),
        kinds.count("WORKFLOW_TASK_STARTED"),
        kinds.count("ACTIVITY_TASK_SCHEDULED"),
        sum(1 for e in markers if e["markerRecordedEventAttributes"].get("markerName") == "core_local_activity"),
        sum(1 for e in markers if patches_of(e)),
        kinds.count("UPSERT_WORKFLOW_SEARCH_ATTRIBUTES"),
        kinds.count("TIMER_STARTED"),
        ", ".join(patches) or "-",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", default="", help="list the events of this history (its file name without .json)")
    args = ap.parse_args()
    if args.events:
        for i, e in enumerate(load(HISTORIES / f"{args.events}.json"), 1):
            print(f"{i:3d} {what(e)}")
        return
    print(table(COLUMNS, [counts(p) for p in sorted(HISTORIES.glob("*.json"))]))


if __name__ == "__main__":
    main()
