"""The fake Messages API answers as the real one does, seen through the real `anthropic` SDK:
its request rules, errors, usage and prompt-caching accounting, and streaming."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import anthropic
import pytest

from schemas.tokens import count_tokens
from tests.fake_anthropic import (
    ErrorStep,
    FakeAnthropic,
    ManualClock,
    request_tokens,
    text_message,
    tool_use_message,
)

MODEL = "claude-sonnet-5"
EPHEMERAL = {"type": "ephemeral"}
BIG = " ".join(f"rule{i}" for i in range(1500))  # well over 1,024 tokens
OTHER_BIG = " ".join(f"other{i}" for i in range(1500))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


@pytest.fixture
def fake(clock) -> Iterator[FakeAnthropic]:
    server = FakeAnthropic(lambda body: text_message("ok"), clock=clock).start()
    yield server
    server.stop()


@pytest.fixture
def client(fake) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=fake.base_url, api_key="test", max_retries=0)


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def cached_system(text: str = BIG, **control) -> list[dict]:
    return [{"type": "text", "text": text, "cache_control": {**EPHEMERAL, **control}}]


def ask(client, **kw) -> anthropic.types.Message:
    kw.setdefault("model", MODEL)
    kw.setdefault("max_tokens", 256)
    kw.setdefault("messages", [user("hi")])
    return client.messages.create(**kw)


def triple(message) -> tuple[int, int, int]:
    u = message.usage
    return u.cache_read_input_tokens, u.cache_creation_input_tokens, u.input_tokens


def whole_prompt(**kw) -> int:
    return request_tokens({"model": MODEL, "messages": [user("hi")], **kw})


def tool(name: str, description: str = "A tool.", **extra) -> dict:
    return {"name": name, "description": description,
            "input_schema": {"type": "object", "properties": {}}, **extra}


# Prompt caching


def test_cache_write_then_read_of_the_same_prefix(client, fake):
    system = cached_system()
    first = ask(client, system=system, messages=[user("hi")])
    prefix = count_tokens(BIG)
    assert triple(first) == (0, prefix, count_tokens("hi") + 4)
    assert first.usage.cache_creation.ephemeral_5m_input_tokens == prefix
    second = ask(client, system=system, messages=[user("something else")])
    assert triple(second) == (prefix, 0, count_tokens("something else") + 4)
    for message, text in ((first, "hi"), (second, "something else")):
        assert sum(triple(message)) == whole_prompt(system=system, messages=[user(text)])
    assert [(u.cache_read, u.cache_creation, u.input) for u in fake.usages] == [
        triple(first), triple(second)]


def test_a_changed_tool_list_or_system_breaks_the_cache(client, clock):
    server = FakeAnthropic(lambda body: text_message("ok"), clock=clock,
                           min_cacheable_tokens=20).start()
    try:
        client = anthropic.Anthropic(base_url=server.base_url, api_key="t", max_retries=0)
        tools = [tool("read_file", "Read a file from the workspace, whole or in part."),
                 tool("write_file", "Write a file in the workspace.",
                      cache_control=EPHEMERAL)]
        system = cached_system("You are a careful assistant. " * 10)
        tools_tokens = whole_prompt(tools=tools) - whole_prompt()
        both = tools_tokens + count_tokens(system[0]["text"])
        assert triple(ask(client, tools=tools, system=system))[:2] == (0, both)
        assert triple(ask(client, tools=tools, system=system))[:2] == (both, 0)
        # A new system keeps the tools' entry (it ends before the system) and rewrites the rest.
        new_system = cached_system("You are a terse assistant. " * 10)
        assert triple(ask(client, tools=tools, system=new_system))[:2] == (
            tools_tokens, count_tokens(new_system[0]["text"]))
        # Any change in the tools, which come first, invalidates everything after them.
        changed = [tools[0], {**tools[1], "description": "Write or overwrite a file."}]
        read, created, _ = triple(ask(client, tools=changed, system=system))
        assert read == 0 and created == whole_prompt(tools=changed, system=system) - (
            count_tokens("hi") + 4)
    finally:
        server.stop()


def test_a_prefix_under_the_model_minimum_is_not_cached(client):
    short = cached_system("A short system prompt.")
    for _ in range(2):
        message = ask(client, system=short)
        assert triple(message) == (0, 0, whole_prompt(system=short))
    # About 1,500 tokens: enough for a Sonnet (1,024), not for a Haiku 3.5 (2,048).
    middling = cached_system(" ".join(f"m{i}" for i in range(750)))
    assert 1024 <= count_tokens(middling[0]["text"]) < 2048
    assert triple(ask(client, model="claude-3-5-haiku-latest", system=middling))[:2] == (0, 0)
    assert triple(ask(client, model="claude-sonnet-4-6", system=middling))[1] > 0


def test_the_cache_is_per_model(client):
    system = cached_system()
    ask(client, model="claude-sonnet-4-6", system=system)
    assert triple(ask(client, model="claude-sonnet-5", system=system))[0] == 0


def test_five_breakpoints_are_refused(client):
    blocks = [{"type": "text", "text": f"part {i}", "cache_control": EPHEMERAL}
              for i in range(5)]
    with pytest.raises(anthropic.BadRequestError) as err:
        ask(client, messages=[{"role": "user", "content": blocks}])
    assert err.value.body["error"] == {
        "type": "invalid_request_error",
        "message": "A maximum of 4 blocks with cache_control may be provided. Found 5."}
    ask(client, messages=[{"role": "user", "content": blocks[:4]}])  # four are fine


def test_entries_expire_after_five_minutes_unless_read(client, clock):
    system = cached_system()
    prefix = count_tokens(BIG)
    assert triple(ask(client, system=system))[:2] == (0, prefix)
    clock.advance(240)
    assert triple(ask(client, system=system))[:2] == (prefix, 0)  # read: refreshed
    clock.advance(240)  # 480 s after the write, 240 after the read
    assert triple(ask(client, system=system))[:2] == (prefix, 0)
    clock.advance(301)
    assert triple(ask(client, system=system))[:2] == (0, prefix)  # expired: written again


def test_a_one_hour_entry_outlives_five_minutes(client, clock):
    system = cached_system(ttl="1h")
    first = ask(client, system=system)
    assert first.usage.cache_creation.ephemeral_1h_input_tokens == count_tokens(BIG)
    clock.advance(3000)
    assert triple(ask(client, system=system))[0] == count_tokens(BIG)
    clock.advance(3601)
    assert triple(ask(client, system=system))[0] == 0


def test_a_one_hour_breakpoint_after_a_five_minute_one_is_refused(client):
    """The API's order rule (its own words): every 1h breakpoint before any 5m one, in the
    order tools, system, messages; an unmarked breakpoint is a 5m one."""
    long_then_short = [user(BIG), {"role": "assistant", "content": "ok"},
                       {"role": "user", "content": cached_system("more", ttl="5m")}]
    ask(client, system=cached_system(ttl="1h"), messages=long_then_short)
    for system, marked in (({}, "1h"), ({"ttl": "5m"}, "1h")):
        with pytest.raises(anthropic.BadRequestError) as err:
            ask(client, system=cached_system(**system),
                messages=[{"role": "user", "content": cached_system("more", ttl=marked)}])
        assert err.value.body["error"]["message"] == (
            "messages.0.content.0.cache_control.ttl: a ttl='1h' cache_control block must not"
            " come after a ttl='5m' cache_control block. Note that blocks are processed in"
            " the following order: `tools`, `system`, `messages`.")


def conversation(turns: int) -> list[dict]:
    messages: list[dict] = [user(BIG)]
    for i in range(turns):
        messages += [{"role": "assistant", "content": f"answer {i}"}, user(f"question {i}")]
    return messages


def with_breakpoint_on_last(messages: list[dict]) -> list[dict]:
    last = messages[-1]
    marked = {"type": "text", "text": last["content"], "cache_control": EPHEMERAL}
    return [*messages[:-1], {"role": last["role"], "content": [marked]}]


def test_a_moving_breakpoint_reads_the_earlier_prefix_within_20_blocks(client):
    first = with_breakpoint_on_last(conversation(2))
    written = triple(ask(client, messages=first))[1]
    assert written == request_tokens({"messages": first})
    later = with_breakpoint_on_last(conversation(4))  # 4 blocks on: within the lookback
    read, created, uncached = triple(ask(client, messages=later))
    assert read == written and uncached == 0
    assert read + created == request_tokens({"messages": later})


def test_past_20_blocks_the_earlier_prefix_is_not_found(client):
    ask(client, messages=with_breakpoint_on_last(conversation(1)))
    far = with_breakpoint_on_last(conversation(12))  # 22 blocks further on
    assert triple(ask(client, messages=far))[0] == 0


def test_automatic_caching_puts_the_breakpoint_on_the_last_block(client):
    messages = conversation(1)
    first = client.messages.create(model=MODEL, max_tokens=64, messages=messages,
                                   cache_control=EPHEMERAL)
    assert triple(first) == (0, request_tokens({"messages": messages}), 0)
    grown = conversation(2)
    second = client.messages.create(model=MODEL, max_tokens=64, messages=grown,
                                    cache_control=EPHEMERAL)
    assert second.usage.cache_read_input_tokens == request_tokens({"messages": messages})


def test_a_step_with_its_own_usage_keeps_it(client, fake):
    fake.push(text_message("scripted", input_tokens=7, output_tokens=3))
    assert triple(ask(client, system=cached_system())) == (0, 0, 7)
    assert fake.usages[-1].input == 7


# Streaming


def answer(body: dict) -> dict:
    if body["messages"][-1]["content"] == "use a tool":
        return tool_use_message([("read_file", {"path": "notes/today.md", "lines": [1, 40],
                                                "why": "to see what was planned"})],
                                text="Let me look at today's notes first.")
    return text_message("Here is a longer answer, so that it arrives in several pieces.",
                        output_tokens=14)


@pytest.mark.parametrize("prompt", ["say something", "use a tool"])
def test_a_stream_assembles_the_same_message(client, fake, prompt):
    fake.responder = answer
    system = cached_system()
    plain = ask(client, system=system, messages=[user(prompt)])
    with client.messages.stream(model=MODEL, max_tokens=256, system=system,
                                messages=[user(prompt)]) as stream:
        streamed = stream.get_final_message()
    def shown(message):  # each answer has its own ids
        return [{**b.model_dump(), "id": None} for b in message.content]

    assert shown(streamed) == shown(plain)
    assert all(b.id.startswith("toolu_") for b in streamed.content if b.type == "tool_use")
    assert streamed.stop_reason == plain.stop_reason
    assert streamed.usage.output_tokens == plain.usage.output_tokens
    # The second request reads what the first wrote; the usage arrives in message_start.
    assert triple(streamed) == (plain.usage.cache_creation_input_tokens, 0,
                                plain.usage.input_tokens)


def test_a_client_keeps_its_connection_as_with_the_api(client, fake):
    """HTTP/1.1 keep-alive: plain and streamed answers, one after another, over one
    connection (a streamed one is chunked, so its end is known without closing)."""
    for _ in range(2):
        ask(client)
        with client.messages.stream(model=MODEL, max_tokens=256,
                                    messages=[user("hi")]) as stream:
            assert stream.get_final_message().content[0].text == "ok"
    assert len(fake.requests) == 4 and fake.connections == 1


def test_the_event_sequence_is_the_apis(client, fake):
    fake.responder = answer
    raw = post(fake, {"model": MODEL, "max_tokens": 64, "stream": True,
                      "messages": [user("use a tool")]})
    assert raw.headers["content-type"].startswith("text/event-stream")
    names = [line.split(": ", 1)[1] for line in raw.text.splitlines()
             if line.startswith("event: ")]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    events = list(ask(client, messages=[user("use a tool")], stream=True))  # pings skipped
    kinds = [e.type for e in events]
    assert events[0].message.content == [] and events[0].message.usage.input_tokens > 0
    text_deltas = [e for e in events if e.type == "content_block_delta" and e.index == 0]
    json_deltas = [e for e in events if e.type == "content_block_delta" and e.index == 1]
    assert len(text_deltas) > 1 and {e.delta.type for e in text_deltas} == {"text_delta"}
    assert len(json_deltas) > 2 and {e.delta.type for e in json_deltas} == {
        "input_json_delta"}
    assert json_deltas[0].delta.partial_json == ""
    assert events[-2].delta.stop_reason == "tool_use" and events[-2].usage.output_tokens == 20
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 2


def test_an_error_before_the_stream_starts_is_a_plain_http_error(client, fake):
    fake.push(ErrorStep(529, "overloaded_error"))
    with pytest.raises(anthropic.APIStatusError) as err:
        with client.messages.stream(model=MODEL, max_tokens=64, messages=[user("hi")]) as s:
            s.get_final_message()
    assert err.value.status_code == 529
    assert err.value.body["error"] == {"type": "overloaded_error", "message": "Overloaded"}


def test_an_error_mid_stream_arrives_as_an_error_event(client, fake):
    fake.push(ErrorStep.overloaded(mid_stream=True))
    seen = []
    with pytest.raises(anthropic.APIStatusError) as err:
        for event in ask(client, stream=True):
            seen.append(event.type)
    assert seen == ["message_start"]  # the 200 had begun
    assert err.value.body["error"]["type"] == "overloaded_error"


async def test_the_async_client_streams_too(fake):
    fake.responder = answer
    client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="t", max_retries=0)
    async with client.messages.stream(model=MODEL, max_tokens=64,
                                      messages=[user("use a tool")]) as stream:
        message = await stream.get_final_message()
    assert message.content[1].input == {"path": "notes/today.md", "lines": [1, 40],
                                        "why": "to see what was planned"}
    await client.close()


# Request rules

TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"}
ASKED = {"role": "assistant", "content": [TOOL_USE]}


@dataclass
class Raw:
    status_code: int
    headers: dict[str, str]
    text: str

    def json(self) -> dict:
        return json.loads(self.text)


def post(fake, body: dict) -> Raw:
    """A request as bare HTTP, for what the SDK would not send."""
    request = urllib.request.Request(
        f"{fake.base_url}/v1/messages", data=json.dumps(body).encode(), method="POST",
        headers={"content-type": "application/json", "x-api-key": "t",
                 "anthropic-version": "2023-06-01"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return Raw(response.status, dict(response.headers), response.read().decode())
    except urllib.error.HTTPError as err:
        return Raw(err.code, dict(err.headers), err.read().decode())


@pytest.mark.parametrize(("body", "message"), [
    ({"max_tokens": 5, "messages": [user("hi")]}, "model: Field required"),
    ({"model": MODEL, "messages": [user("hi")]}, "max_tokens: Field required"),
    ({"model": MODEL, "max_tokens": 5}, "messages: Field required"),
    ({"model": MODEL, "max_tokens": 5, "messages": []},
     "messages: at least one message is required"),
    ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user"}]},
     "messages.0.content: Field required"),
])
def test_missing_fields(fake, body, message):
    response = post(fake, body)
    assert response.status_code == 400
    assert response.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                          "message": message},
                               "request_id": response.headers["request-id"]}
    assert response.headers["request-id"].startswith("req_")
    assert fake.rejections[-1].message == message


@pytest.mark.parametrize(("kw", "message"), [
    ({"messages": [user("hi"), {"role": "assistant", "content": "x"},
                   {"role": "user", "content": [RESULT]}]},
     "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_1."
     " Each `tool_result` block must have a corresponding `tool_use` block in the previous"
     " message."),
    ({"messages": [user("hi"), ASKED, user("what now?")]},
     "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after:"
     " toolu_1. Each `tool_use` block must have a corresponding `tool_result` block in the"
     " next message."),
    ({"messages": [user("hi"), ASKED, {"role": "user", "content": [
        {"type": "text", "text": "here:"}, RESULT]}]},
     "messages.2: Did not find 1 `tool_result` block(s) at the beginning of this message."
     " Messages following `tool_use` blocks must begin with a matching number of"
     " `tool_result` blocks."),
    ({"messages": [user("hi"), {"role": "assistant", "content": [TOOL_USE, TOOL_USE]},
                   {"role": "user", "content": [RESULT]}]},
     "messages.1.content.1: `tool_use` ids must be unique"),
    ({"messages": [user("hi"), {"role": "assistant", "content": [
        {**TOOL_USE, "id": "functions.read_file:0"}]},
        {"role": "user", "content": [{**RESULT, "tool_use_id": "functions.read_file:0"}]}]},
     "messages.1.content.0.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"),
    ({"messages": [user("hi"), ASKED, {"role": "user", "content": [RESULT]}]},
     "Requests which include tool_use or tool_result blocks must define tools."),
    ({"messages": [user("hi"), ASKED, {"role": "user", "content": [RESULT]}],
      "tools": [tool("write_file")]},
     "messages.1.content.0.tool_use.name: 'read_file' is not the name of any tool in"
     " `tools`"),
    ({"tools": [tool("read_file"), tool("read_file")]}, "tools: Tool names must be unique."),
    ({"tools": [tool("read.file")]},
     "tools.0.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'"),
    ({"tools": [tool("x" * 129)]},
     "tools.0.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
     "messages: text content blocks must be non-empty"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": " \n"}]}]},
     "messages: text content blocks must contain non-whitespace text"),
    ({"system": [{"type": "text", "text": ""}]}, "system: text content blocks must be non-empty"),
    ({"messages": [user(""), {"role": "assistant", "content": "x"}, user("y")]},
     "messages.0: all messages must have non-empty content except for the optional final"
     " assistant message"),
    ({"model": "claude-3-5-haiku-latest", "max_tokens": 8193},
     "max_tokens: 8193 > 8192, which is the maximum allowed number of output tokens for"
     " claude-3-5-haiku-latest"),
])
def test_request_rules(client, kw, message):
    with pytest.raises(anthropic.BadRequestError) as err:
        ask(client, **kw)
    assert err.value.body["error"] == {"type": "invalid_request_error", "message": message}
    assert err.value.request_id and err.value.request_id.startswith("req_")


def test_a_prompt_over_the_window_is_too_long(clock):
    server = FakeAnthropic(lambda body: text_message("ok"), context_window=1000,
                           clock=clock).start()
    try:
        client = anthropic.Anthropic(base_url=server.base_url, api_key="t", max_retries=0)
        size = whole_prompt(system=BIG)
        with pytest.raises(anthropic.BadRequestError) as err:
            ask(client, system=BIG)
        assert err.value.body["error"]["message"] == (
            f"prompt is too long: {size} tokens > 1000 maximum")
        with pytest.raises(anthropic.BadRequestError) as err:
            ask(client, max_tokens=999)
        assert err.value.body["error"]["message"] == (
            f"input length and `max_tokens` exceed context limit: {whole_prompt()} + 999 >"
            " 1000, decrease input length or `max_tokens` and try again")
        assert ask(client, max_tokens=990).content[0].text == "ok"
    finally:
        server.stop()


def test_the_rules_run_before_the_script(client, fake):
    fake.push(text_message("scripted"))
    with pytest.raises(anthropic.BadRequestError):
        ask(client, tools=[tool("same"), tool("same")])
    assert ask(client).content[0].text == "scripted"  # the step was not used up
    assert len(fake.requests) == 2


def test_a_tool_exchange_that_follows_the_rules_is_accepted(client):
    messages = [user("hi"), {"role": "assistant", "content": [
        {"type": "text", "text": "Reading."}, TOOL_USE]},
        {"role": "user", "content": [RESULT, {"type": "text", "text": "and then?"}]}]
    assert ask(client, messages=messages, tools=[tool("read_file")]).content[0].text == "ok"
    # The last message may be an assistant's tool_use with nothing after it yet.
    assert ask(client, messages=[user("hi"), ASKED],
               tools=[tool("read_file")]).content[0].text == "ok"


def test_strict_off_lets_a_sloppy_request_through(clock):
    server = FakeAnthropic(lambda body: text_message("ok"), strict=False, clock=clock).start()
    try:
        response = post(server, {"model": MODEL, "messages": [user("hi"), ASKED, user("x")],
                                 "tools": [tool("a.b"), tool("a.b")]})
        assert response.status_code == 200 and not server.rejections
    finally:
        server.stop()


# Errors


@pytest.mark.parametrize(("step", "status", "kind", "cls"), [
    (ErrorStep(529, "overloaded_error"), 529, "overloaded_error", anthropic.APIStatusError),
    (ErrorStep.rate_limited(7), 429, "rate_limit_error", anthropic.RateLimitError),
    (ErrorStep(500), 500, "api_error", anthropic.InternalServerError),
    (ErrorStep(401), 401, "authentication_error", anthropic.AuthenticationError),
    (ErrorStep.too_large(), 413, "request_too_large", anthropic.APIStatusError),
    (ErrorStep(400, "invalid_request_error", "bad request body"), 400,
     "invalid_request_error", anthropic.BadRequestError),
])
def test_scripted_errors_are_shaped_as_the_apis(client, fake, step, status, kind, cls):
    fake.push(step)
    with pytest.raises(cls) as err:
        ask(client)
    assert err.value.status_code == status
    body = err.value.body
    assert body["type"] == "error" and body["error"]["type"] == kind
    assert body["error"]["message"] and body["request_id"] == err.value.request_id
    if status == 429:
        assert err.value.response.headers["retry-after"] == "7"


def test_push_reset_and_the_responder_still_work(client, fake):
    fake.push(text_message("one"), text_message("two", model="claude-opus-4-8"))
    replies = [ask(client) for _ in range(3)]
    assert [r.content[0].text for r in replies] == ["one", "two", "ok"]
    assert [r.model for r in replies] == [MODEL, "claude-opus-4-8", MODEL]
    assert len(fake.requests) == 3 and fake.requests[0]["model"] == MODEL
    fake.reset()
    assert fake.requests == [] and fake.usages == []
    with pytest.raises(anthropic.InternalServerError):
        ask(client)  # no script, no responder


def test_tool_definitions_can_be_left_uncounted(client, fake):
    tools = [tool("read_file", "Read a file.")]
    counted = ask(client, tools=tools).usage.input_tokens
    fake.count_tool_definitions = False
    assert ask(client, tools=tools).usage.input_tokens == whole_prompt() < counted


def test_count_tokens_counts_the_whole_prompt(client):
    tools = [tool("read_file")]
    counted = client.messages.count_tokens(model=MODEL, messages=[user("hi")], tools=tools,
                                           system=BIG)
    assert counted.input_tokens == whole_prompt(tools=tools, system=BIG)
