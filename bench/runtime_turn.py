"""Part a of bench_runtime: Keel's plain turn beside Temporal's floor on the same stack and
the same fake model, so that what is left between the two is the harness's own cost."""

from __future__ import annotations

import json
import statistics
import time
import uuid
from typing import Any

import anthropic
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from bench.common import percentile, table
from bench.floor import FloorWorkflow
from bench.stack import history_counts, ms, say, wait_idle
from keel.client import KeelClient, session_config
from schemas.config import KeelSettings
from schemas.tokens import count_tokens
from tests.fake_anthropic import FakeAnthropic, text_message


@activity.defn(name="bench_floor_model_call")
async def floor_model_call(text: str) -> str:
    """The floor's one activity: the same fake Messages API through the `anthropic` SDK.
    `text` is the user's message, or SAME_REQUEST: then it sends the request Keel's turn
    just sent (kept in this process, so the floor pays no payload for it), so that the
    model's side costs both the same."""
    assert _FLOOR_SDK is not None
    body: dict[str, Any] = _FLOOR_SAME[0] if text == SAME_REQUEST and _FLOOR_SAME else {
        "model": "fake-model", "max_tokens": 64,
        "messages": [{"role": "user", "content": text}]}
    if body.get("stream"):  # Keel streamed it: so does the floor, to the final message
        async with _FLOOR_SDK.messages.stream(
                **{k: v for k, v in body.items() if k != "stream"}) as stream:
            message = await stream.get_final_message()
    else:
        message = await _FLOOR_SDK.messages.create(**body)
    return "".join(getattr(b, "text", "") for b in message.content)


_FLOOR_SDK: anthropic.AsyncAnthropic | None = None
SAME_REQUEST = "<keel's last request>"
_FLOOR_SAME: list[dict[str, Any]] = []  # the request Keel's last turn sent


async def sdk_medians(base_url: str, bodies: dict[str, dict[str, Any]],
                      runs: int) -> dict[str, list[float]]:
    sdk = anthropic.AsyncAnthropic(base_url=base_url, api_key="x", max_retries=0)
    out: dict[str, list[float]] = {}
    try:
        for name, body in bodies.items():
            for _ in range(5):
                await sdk.messages.create(**body)
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                await sdk.messages.create(**body)
                times.append(time.perf_counter() - t0)
            out[name] = times
    finally:
        await sdk.close()
    return out


async def bench_turn_overhead(client: Client, settings: KeelSettings, fake: FakeAnthropic,
                              turns: int, warmup: int) -> dict[str, Any]:
    """Keel's plain turn (SessionHandle.ask) and the floor's turn, alternating, on the same
    stack and fake server; then both histories counted per turn."""
    global _FLOOR_SDK
    fake.reset(lambda body: text_message("ok"))
    keel = KeelClient(client, settings.task_queue, settings)
    session = await keel.start_session(f"bench-turn-{uuid.uuid4().hex[:6]}",
                                       config=session_config(settings))
    floor_queue = f"{settings.task_queue}-floor"
    _FLOOR_SDK = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="x", max_retries=0)
    floor_id = f"bench-floor-{uuid.uuid4().hex[:6]}"
    async with Worker(client, task_queue=floor_queue, workflows=[FloorWorkflow],
                      activities=[floor_model_call]):
        floor = await client.start_workflow(FloorWorkflow.run, id=floor_id,
                                            task_queue=floor_queue)

        async def floor_turn(text: str) -> float:
            t0 = time.perf_counter()
            got = await floor.execute_update(FloorWorkflow.turn, text)
            assert got == "ok", got
            return time.perf_counter() - t0

        async def keel_turn(text: str) -> float:
            t0 = time.perf_counter()
            outcome = await session.ask(text)
            took = time.perf_counter() - t0
            if outcome.error or outcome.reply_text != "ok":
                raise RuntimeError(f"turn failed: {outcome}")
            return took

        for i in range(warmup):
            await keel_turn(f"warm-up message {i}")
            await floor_turn(f"warm-up message {i}")
        await wait_idle(session)  # the last warm-up's transcript written
        keel_before = await history_counts(client, session.session_id)
        floor_before = await history_counts(client, floor_id)
        keel_times: list[float] = []
        floor_times: list[float] = []
        same_times: list[float] = []
        for i in range(turns):  # alternating, the first of each pair swapped every turn
            text = f"message {i}: please answer about the retry logic"
            if i % 2:
                floor_times.append(await floor_turn(text))
                keel_times.append(await keel_turn(text))
            else:
                keel_times.append(await keel_turn(text))
                floor_times.append(await floor_turn(text))
            # The floor again, sending the request Keel's turn just sent.
            _FLOOR_SAME[:] = [dict(fake.requests[-1])]
            same_times.append(await floor_turn(SAME_REQUEST))
        await wait_idle(session)
        keel_after = await history_counts(client, session.session_id)
        floor_after = await history_counts(client, floor_id)
        await floor.signal(FloorWorkflow.finish)
        await floor.result()
    await _FLOOR_SDK.close()
    _FLOOR_SDK = None
    keel_request = dict(fake.requests[-1])
    bodies = {
        "minimal request": {"model": "fake-model", "max_tokens": 64,
                            "messages": [{"role": "user", "content": "hi"}]},
        "Keel's last request": keel_request,
    }
    sdk = await sdk_medians(fake.base_url, bodies, turns)
    same = statistics.median(sdk["Keel's last request"])
    keel_median, floor_median = statistics.median(keel_times), statistics.median(floor_times)
    return {
        "turns": turns, "warmup": warmup,
        "ask_median_ms": ms(keel_median), "ask_p90_ms": ms(percentile(keel_times, 90)),
        "ask_min_ms": ms(min(keel_times)), "ask_max_ms": ms(max(keel_times)),
        "floor_median_ms": ms(floor_median), "floor_p90_ms": ms(percentile(floor_times, 90)),
        "floor_min_ms": ms(min(floor_times)),
        "ratio_median": round(keel_median / floor_median, 2),
        "ratio_p90": round(percentile(keel_times, 90) / percentile(floor_times, 90), 2),
        "floor_same_request_median_ms": ms(statistics.median(same_times)),
        "floor_same_request_p90_ms": ms(percentile(same_times, 90)),
        "ratio_same_request_median": round(keel_median / statistics.median(same_times), 2),
        "ratio_same_request_p90": round(percentile(keel_times, 90)
                                        / percentile(same_times, 90), 2),
        "events_per_turn": round((keel_after[0] - keel_before[0]) / turns, 1),
        "workflow_tasks_per_turn": round((keel_after[1] - keel_before[1]) / turns, 1),
        "floor_events_per_turn": round((floor_after[0] - floor_before[0]) / (2 * turns), 1),
        "floor_workflow_tasks_per_turn": round((floor_after[1] - floor_before[1]) / (2 * turns),
                                                1),
        "sdk_minimal_median_ms": ms(statistics.median(sdk["minimal request"])),
        "sdk_minimal_p90_ms": ms(percentile(sdk["minimal request"], 90)),
        "sdk_same_request_median_ms": ms(same),
        "sdk_same_request_p90_ms": ms(percentile(sdk["Keel's last request"], 90)),
        "keel_request_messages": len(keel_request.get("messages", [])),
        "keel_request_tokens_estimate": sum(
            count_tokens(json.dumps(keel_request.get(k, ""))) for k in
            ("system", "messages", "tools")),
        "harness_overhead_median_ms": ms(keel_median - same),
    }


def report_turn(a: dict[str, Any], how: str) -> None:
    say("")
    say(table(
        f"a. A plain turn beside Temporal's floor ({how}), fake model answering at once "
        f"({a['turns']} turns each, alternating, after {a['warmup']} warm-up)",
        ["what", "median ms", "p90 ms", "events/turn", "workflow tasks/turn"],
        [["Keel: SessionHandle.ask (update -> reply)", a["ask_median_ms"], a["ask_p90_ms"],
          a["events_per_turn"], a["workflow_tasks_per_turn"]],
         ["floor: one Update running one activity (SDK call)", a["floor_median_ms"],
          a["floor_p90_ms"], a["floor_events_per_turn"], a["floor_workflow_tasks_per_turn"]],
         ["floor sending Keel's own last request", a["floor_same_request_median_ms"],
          a["floor_same_request_p90_ms"], "", ""],
         ["bare anthropic SDK call, minimal request", a["sdk_minimal_median_ms"],
          a["sdk_minimal_p90_ms"], "", ""],
         [f"bare anthropic SDK call, Keel's own last request ({a['keel_request_messages']} "
          "messages)", a["sdk_same_request_median_ms"], a["sdk_same_request_p90_ms"], "", ""]]))
    say(f"   Keel / floor: {a['ratio_median']}x at the median, {a['ratio_p90']}x at p90 "
        "(bar: <= 1.5x, <= 20 events per plain turn); against the floor sending Keel's "
        f"own request: {a['ratio_same_request_median']}x / {a['ratio_same_request_p90']}x")
