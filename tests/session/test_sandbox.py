"""The worker's sandbox passes Keel's packages through (workers.entry_guard): a new session
runs on the worker's loaded workflow module, never one executed again for it; the replay
tests keep the SDK's default sandbox, which does. A converter that takes no serialization
context is never given one; one that takes them still gets the sandbox's."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import uuid
from collections.abc import Sequence

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    ActivitySerializationContext,
    PayloadCodec,
    SerializationContext,
    WithSerializationContext,
    WorkflowSerializationContext,
)

from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings
from workers.entry_guard import PASSED_THROUGH, ignores_context, keel_sandbox
from workers.payload_refs import never_stores, service_converter, worker_converter


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


class _ContextRecorder(PayloadCodec, WithSerializationContext):
    """A codec that changes no byte, remembers the contexts it was made for, and refuses
    to work without one (as a codec that encrypts per workflow would have to)."""

    def __init__(self, seen: list[SerializationContext],
                 context: SerializationContext | None = None) -> None:
        self.seen, self.context = seen, context

    def with_context(self, context: SerializationContext) -> _ContextRecorder:
        self.seen.append(context)
        return _ContextRecorder(self.seen, context)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return self._check(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return self._check(payloads)

    def _check(self, payloads: Sequence[Payload]) -> list[Payload]:
        if self.context is None and payloads:
            raise RuntimeError("a payload without its serialization context")
        return list(payloads)


def test_only_a_converter_that_takes_no_context_is_told_there_is_none(tmp_path) -> None:
    keels = worker_converter(pydantic_data_converter)
    assert ignores_context(keels) and never_stores(keels)
    recorder = dataclasses.replace(pydantic_data_converter, payload_codec=_ContextRecorder([]))
    assert not ignores_context(recorder)
    # A service's worker keeps its large results in Keel's store: its targets matter.
    assert not never_stores(service_converter(make_settings(None, tmp_path)))


async def test_a_converter_that_takes_contexts_still_gets_them(
        client, database_url, fake_anthropic, tmp_path) -> None:
    seen: list[SerializationContext] = []
    converter = dataclasses.replace(pydantic_data_converter,
                                    payload_codec=_ContextRecorder(seen))
    with_codec = Client(**{**client.config(), "data_converter": converter})
    fake_anthropic.push(text_message("one"))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(with_codec, settings) as keel:
        session = await keel.start_session(f"contexts-{uuid.uuid4().hex[:8]}")
        assert (await session.ask("hi")).reply_text == "one"
    workflows = {c.workflow_id for c in seen if isinstance(c, WorkflowSerializationContext)}
    activities = {c.activity_type for c in seen if isinstance(c, ActivitySerializationContext)}
    assert session.session_id in workflows
    assert "call_model" in activities
