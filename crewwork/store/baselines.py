"""Baselines and flaky tests (crewwork.validation.baseline, docs/lifecycle.md): the validation command's usable
result on a base commit, cached per tenant, repository, base commit and definition, and each repository's flaky
list. Every read and write names the tenant: one tenant's baseline is never another's, even for the same URL and
commit."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from crewwork.store.engine import Database
from crewwork.store.tables import FlakyTest, ValidationBaseline
from crewwork.store.views import StoredFlakyTest, select_view, views_of

MAX_FLAKY_LISTED = 1_000
"""Flaky tests one read of a repository's list returns (most recently seen first)."""


class BaselineStore(Database):
    async def get_baseline(
        self, tenant_id: str, repository: str, base_commit: str, definition: str
    ) -> dict[str, Any] | None:
        async with self.session() as s:
            row = await s.scalar(
                select(ValidationBaseline.facts).where(
                    ValidationBaseline.tenant_id == tenant_id,
                    ValidationBaseline.repository == repository,
                    ValidationBaseline.base_commit == base_commit,
                    ValidationBaseline.definition == definition,
                )
            )
        return dict(row) if row is not None else None

    async def put_baseline(
        self, tenant_id: str, repository: str, base_commit: str, definition: str, facts: dict[str, Any]
    ) -> None:
        """Keep a usable baseline; the first one written wins (two validations on the same base ran the same)."""
        try:
            async with self.session() as s:
                s.add(
                    ValidationBaseline(
                        tenant_id=tenant_id,
                        repository=repository,
                        base_commit=base_commit,
                        definition=definition,
                        facts=facts,
                        created_at=await self.now(s),
                    )
                )
        except IntegrityError:
            return

    async def record_flaky(
        self, tenant_id: str, repository: str, runs: dict[str, str], *, work_item_id: str, attempt: int
    ) -> None:
        """Add the tests a validation saw flaky (`runs`: test id -> in which runs it failed and passed) to the
        repository's list, or count them again."""
        for test_id, line in sorted(runs.items()):
            key = (tenant_id, repository, test_id[:1000])
            for _ in range(2):  # a concurrent first insert of the same test: count it again instead
                try:
                    async with self.session() as s:
                        now = await self.now(s)
                        row = await s.get(FlakyTest, key)
                        if row is None:
                            s.add(
                                FlakyTest(
                                    tenant_id=tenant_id,
                                    repository=repository,
                                    test_id=key[2],
                                    times=1,
                                    first_seen_at=now,
                                    last_seen_at=now,
                                    last_work_item_id=work_item_id,
                                    last_attempt=attempt,
                                    last_runs=line[:2000],
                                )
                            )
                        else:
                            row.times += 1
                            row.last_seen_at = now
                            row.last_work_item_id = work_item_id
                            row.last_attempt = attempt
                            row.last_runs = line[:2000]
                    break
                except IntegrityError:
                    continue

    async def list_flaky(
        self, tenant_id: str | None, repository: str, *, limit: int = MAX_FLAKY_LISTED
    ) -> list[StoredFlakyTest]:
        """The repository's flaky list, most recently seen first; `tenant_id` None: any tenant's (operators, by a
        registration id, which names one tenant's repository anyway)."""
        async with self.session() as s:
            q = select_view(StoredFlakyTest, FlakyTest).where(FlakyTest.repository == repository)
            if tenant_id is not None:
                q = q.where(FlakyTest.tenant_id == tenant_id)
            q = q.order_by(FlakyTest.last_seen_at.desc(), FlakyTest.test_id).limit(min(limit, MAX_FLAKY_LISTED))
            return await views_of(StoredFlakyTest, s.execute(q))
