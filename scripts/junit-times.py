"""Sum the test times of JUnit reports (pytest --junitxml): a less noisy figure than wall time when comparing two runs.

    python scripts/junit-times.py test-artifacts/parallel.xml [more.xml ...] [--by-file]

Prints the number of test cases and the sum of their times (setup, call and teardown: pytest's default
junit_duration_report), and with --by-file the sum per test file, largest first.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def module_of(classname: str) -> str:
    """The test module of a JUnit classname: `tests.api.test_x` for a function, `tests.api.test_x.TestY` for a method
    of a class (whose name starts with a capital)."""
    head, _, last = classname.rpartition(".")
    return head if head and last[:1].isupper() else classname


def main(argv: list[str]) -> None:
    by_file = "--by-file" in argv
    paths = [a for a in argv if a != "--by-file"]
    total = 0.0
    count = 0
    files: dict[str, float] = defaultdict(float)
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            t = float(case.get("time", "0"))
            total += t
            count += 1
            files[module_of(case.get("classname", ""))] += t
    print(f"{count} tests, sum of test times {total:.1f} s")
    if by_file:
        for name, t in sorted(files.items(), key=lambda kv: -kv[1]):
            print(f"  {t:8.1f} s  {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
