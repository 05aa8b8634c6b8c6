"""What the store's reads hand out (crewwork/store/views.py): frozen views, detached from any session, an artifact's
bytes only when the read asked for them."""

from __future__ import annotations

import dataclasses

import pytest

from crewwork.models import WorkItemSpec
from crewwork.store.store import Store


async def test_reads_return_frozen_views_and_load_artifact_bytes_only_when_asked(any_store: Store) -> None:
    tid = await any_store.ensure_tenant("views")
    spec = WorkItemSpec.model_validate({"kind": "task", "input": {}})
    item, _ = await any_store.create_work_item(tenant_id=tid, spec=spec, base_commit=None, repo_path=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        item.state = "succeeded"  # type: ignore[misc]

    put = await any_store.put_artifact(work_item_id=item.id, tenant_id=tid, name="log.txt", data=b"hello")
    assert put.ref().model_dump() == {
        "id": put.id,
        "name": "log.txt",
        "size": 5,
        "sha256": "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
        "content_type": "text/plain",
    }

    [listed] = await any_store.list_artifacts(item.id)
    without = await any_store.work_item_artifact(item.id, put.id, with_content=False)
    assert listed.content is None and without is not None and without.content is None
    with pytest.raises(ValueError, match="without its content"):
        _ = without.content_bytes
    with_bytes = await any_store.work_item_artifact(item.id, put.id, with_content=True)
    assert with_bytes is not None and with_bytes.content_bytes == b"hello"
    assert dataclasses.replace(with_bytes, content=None) == listed == without

    [event] = await any_store.list_events(item.id)
    assert (event.type, event.work_item_id) == ("submitted", item.id)
