"""The worker's sandbox passes Keel's packages through (workers.entry_guard): a new session
runs on the worker's loaded workflow module, never one executed again for it; the replay
tests keep the SDK's default sandbox, which does."""

from __future__ import annotations

import importlib.machinery
import uuid

import pytest

from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings
from workers.entry_guard import PASSED_THROUGH, keel_sandbox


async def test_a_new_session_does_not_execute_the_workflow_module_again(
        client, database_url, fake_anthropic, tmp_path, monkeypatch: pytest.MonkeyPatch):
    loaded: list[str] = []
    get_code = importlib.machinery.SourceFileLoader.get_code

    def spy(self: importlib.machinery.SourceFileLoader, name: str) -> object:
        loaded.append(name)
        return get_code(self, name)

    fake_anthropic.push(text_message("one"))
    fake_anthropic.push(text_message("two"))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(client, settings) as keel:
        monkeypatch.setattr(importlib.machinery.SourceFileLoader, "get_code", spy)
        for reply in ("one", "two"):  # two new workflow instances
            session = await keel.start_session(f"sandbox-{uuid.uuid4().hex[:8]}")
            assert (await session.ask("hi")).reply_text == reply
    assert not [n for n in loaded if n.split(".")[0] in PASSED_THROUGH], loaded


def test_the_sandbox_passes_keels_packages_through() -> None:
    restrictions = keel_sandbox().restrictions
    assert set(PASSED_THROUGH) <= restrictions.passthrough_modules
    assert not restrictions.passthrough_all_modules  # the SDK's own restrictions stay
