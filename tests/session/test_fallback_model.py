"""A fallback model: when a session's model keeps failing in a way a retry could help
(overloaded, rate-limited), a model call's third attempt asks the fallback the session's
agent names (else the worker's KEEL_FALLBACK_MODEL), and the session's readers are told
when it turns to it; the worker then asks the fallback first for its hold (its end:
tests/activities/test_fallback_hold.py); a refusal no retry helps never reaches the
fallback. Real Temporal,
real PostgreSQL, the fake Messages API (answering as the API does, `retry-after` and all).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from keel.client import session_config
from schemas.agent import AgentSpec
from schemas.config import KeelSettings
from schemas.events import EventType
from tests.fake_anthropic import ErrorStep, text_message
from tests.harness import keel_worker, make_settings
from tests.session.streams import Reader

PRIMARY, FALLBACK = "claude-primary-1", "claude-fallback-1"


def overloaded() -> ErrorStep:
    """The API's 529, told to come back at once (so the test waits no back-off)."""
    step = ErrorStep.overloaded()
    step.headers = {"retry-after": "0.1"}
    return step


class Api:
    """The primary model overloaded while `down`; every request's model noted."""

    def __init__(self) -> None:
        self.down = True
        self.asked: list[str] = []

    def __call__(self, body: dict[str, Any]) -> Any:
        self.asked.append(body["model"])
        if body["model"] == PRIMARY and self.down:
            return overloaded()
        if body["model"] == PRIMARY and "refuse this" in json.dumps(body["messages"][-1]):
            return ErrorStep.invalid("messages: text content blocks must be non-empty")
        return text_message(f"answered by {body['model']}")


def worker_settings(database_url: str, tmp_path: Any, base_url: str,
                    **model: Any) -> KeelSettings:
    settings = make_settings(database_url, tmp_path, base_url)
    return settings.model_copy(update={"model": settings.model.model_copy(update=model)})


async def test_the_third_attempt_asks_the_fallback_and_the_worker_holds_it(
        client, database_url, fake_anthropic, tmp_path):
    api = fake_anthropic.responder = Api()
    settings = worker_settings(database_url, tmp_path, fake_anthropic.base_url)
    config = session_config(settings).with_agent(AgentSpec(model=PRIMARY,
                                                           fallback_model=FALLBACK))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"fallback-{uuid.uuid4().hex[:8]}", config=config)
        reader = Reader(keel, session.session_id)
        outcome = await session.ask("What is the status?")
        assert outcome.reply_text == f"answered by {FALLBACK}"
        assert api.asked == [PRIMARY, PRIMARY, FALLBACK]
        await reader.until(lambda r: len(r.of(EventType.TURN_ENDED)) >= 1)
        notes = [e.message for e in reader.of(EventType.ERROR)]
        assert len(notes) == 2 and all("529 Overloaded" in n for n in notes), notes
        assert notes[0].startswith("the model API failed (attempt 1 of 12: ")
        assert notes[0].endswith("); asking again")
        assert notes[1].startswith("the model API failed (attempt 2 of 12: ")
        assert notes[1].endswith(f"); asking {FALLBACK} instead")
        api.asked = []
        outcome = await session.ask("Still down?")  # held: the fallback first, no waiting
        assert outcome.reply_text == f"answered by {FALLBACK}" and api.asked == [FALLBACK]
        reader.stop()
        await session.end()


async def test_a_worker_s_fallback_serves_a_session_whose_agent_names_none(
        client, database_url, fake_anthropic, tmp_path):
    api = fake_anthropic.responder = Api()
    settings = worker_settings(database_url, tmp_path, fake_anthropic.base_url,
                               fallback_model=FALLBACK)
    config = session_config(settings).with_agent(AgentSpec(model=PRIMARY))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"fallback-w-{uuid.uuid4().hex[:8]}",
                                           config=config)
        api.down = False
        outcome = await session.ask("refuse this")  # no retry helps: no fallback either
        assert outcome.error and "must be non-empty" in outcome.error
        assert api.asked == [PRIMARY]
        api.down, api.asked = True, []
        outcome = await session.ask("What is the status?")
        assert outcome.reply_text == f"answered by {FALLBACK}"
        assert api.asked == [PRIMARY, PRIMARY, FALLBACK]
        await session.end()
