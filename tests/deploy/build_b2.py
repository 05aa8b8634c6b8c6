"""A second build of crewwork's pools for tests/deploy/test_worker_versioning.py: the same code with a deliberately
different WorkItemWorkflow, run as `python -m tests.deploy.build_b2 worker --pool ...`.

What differs, so that the test can tell which build ran an item, and so that a b1 history replayed by this code
fails (NondeterminismError): before landing, the workflow sleeps on a timer b1 never scheduled, and the delivery
commit's message starts with `[b2]`."""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

from temporalio import workflow

from crewwork.workflows import work_item

MARK = "[b2] "

_land = work_item.WorkItemWorkflow._land
_message = work_item.commit_message


async def _land_b2(self: Any, passed: Any, loop: Any, ws: Any) -> Any:
    await workflow.sleep(timedelta(milliseconds=10))
    return await _land(self, passed, loop, ws)


def _message_b2(*args: Any, **kwargs: Any) -> str:
    # Whatever commit_message takes (the review record was added to it): only the mark is b2's.
    return MARK + _message(*args, **kwargs)


def patch() -> None:
    work_item.WorkItemWorkflow._land = _land_b2  # type: ignore[method-assign]
    work_item.commit_message = _message_b2


if __name__ == "__main__":
    patch()
    from crewwork.cli.main import main

    sys.exit(main(sys.argv[1:]))
