"""The worker pools by name: each is a task queue (`<prefix>-<pool>`) and a process kind (docs/architecture.md,
"Worker pools"). The one definition; the workflow, the steps' policies, the workers, the CLI and the API derive
theirs from it."""

from __future__ import annotations

from typing import Literal, get_args

Pool = Literal["control", "agent", "validate"]
POOLS: tuple[Pool, ...] = get_args(Pool)
