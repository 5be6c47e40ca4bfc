"""How long the fake Messages API (tests/fake_anthropic) takes to answer, through the SDK.

    .venv/bin/python bench/bench_fake.py [--runs 50]

Three requests, each sent `--runs` times after 5 warm-ups, median and p90 in ms:
a minimal one; a realistic session request (~200 messages with tool calls, a ~5k-token
system prompt, 12 tools, cache breakpoints) sent unchanged; and a growing conversation
where each request adds two new messages (so only the new blocks are new content).
Figures go to stdout and bench/results/fake.json, with the commit measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import anthropic  # noqa: E402

from bench.common import percentile, source_commit, table  # noqa: E402
from tests.fake_anthropic import FakeAnthropic, text_message  # noqa: E402

WORDS = ("session workflow activity signal history replay checkpoint memory window token "
         "prompt cache tool result approval scope agent runtime worker queue").split()


def prose(seed: int, words: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 13 + i // 5) % len(WORDS)] + str((seed + i) % 97)
                    for i in range(words))


def tools() -> list[dict[str, Any]]:
    return [{"name": f"tool_{i}", "description": prose(1000 + i, 60),
             "input_schema": {"type": "object",
                              "properties": {f"arg{k}": {"type": "string",
                                                         "description": prose(i * 10 + k, 12)}
                                             for k in range(4)},
                              "required": ["arg0"]}}
            for i in range(12)]


def exchange(n: int) -> list[dict[str, Any]]:
    """Message pair n: a user turn and a reply, or a tool call and its result."""
    if n % 3 == 2:
        call = f"toolu_{n:05d}"
        return [{"role": "assistant", "content": [
                    {"type": "text", "text": prose(n, 20)},
                    {"type": "tool_use", "id": call, "name": f"tool_{n % 12}",
                     "input": {"arg0": prose(n + 1, 8), "arg1": n}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": call,
                     "content": [{"type": "text", "text": prose(n + 2, 120)}]}]}]
    return [{"role": "user", "content": prose(n, 40)},
            {"role": "assistant", "content": [{"type": "text", "text": prose(n + 3, 80)}]}]


def session_body(pairs: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for n in range(pairs):
        messages.extend(exchange(n))
    messages.append({"role": "user", "content": [
        {"type": "text", "text": prose(pairs, 30), "cache_control": {"type": "ephemeral"}}]})
    return {"model": "claude-sonnet-4-5", "max_tokens": 4096, "tools": tools(),
            "system": [{"type": "text", "text": prose(7, 2600),
                        "cache_control": {"type": "ephemeral"}}],
            "messages": messages}


def timed(sdk: anthropic.Anthropic, bodies: list[dict[str, Any]], warmup: int) -> list[float]:
    for body in bodies[:warmup]:
        sdk.messages.create(**body)
    times = []
    for body in bodies[warmup:]:
        t0 = time.perf_counter()
        sdk.messages.create(**body)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    fake = FakeAnthropic(lambda body: text_message("ok")).start()
    sdk = anthropic.Anthropic(base_url=fake.base_url, api_key="x", max_retries=0)
    warmup = 5
    minimal = {"model": "fake-model", "max_tokens": 64,
               "messages": [{"role": "user", "content": "hi"}]}
    session = session_body(104)
    growing = []
    for k in range(warmup + args.runs):
        body = session_body(80 + k)
        growing.append(body)
    results: dict[str, Any] = {"commit": source_commit(), "runs": args.runs,
                               "session_messages": len(session["messages"]),
                               "session_tokens": fake.tokens(session)}
    rows = []
    try:
        for name, bodies in [("minimal", [minimal] * (warmup + args.runs)),
                             ("session, same request", [session] * (warmup + args.runs)),
                             ("session, growing", growing)]:
            fake.reset(lambda body: text_message("ok"))
            times = timed(sdk, bodies, warmup)
            if fake.rejections:
                raise RuntimeError(f"fake refused a request: {fake.rejections[0].message}")
            med, p90 = statistics.median(times) * 1000, percentile(times, 90) * 1000
            results[name] = {"median_ms": round(med, 2), "p90_ms": round(p90, 2)}
            rows.append((name, f"{med:.2f}", f"{p90:.2f}"))
    finally:
        sdk.close()
        fake.stop()
    print(table(f"Fake Messages API, SDK round trip ({args.runs} runs, commit "
                f"{results['commit']}; session: {results['session_messages']} messages, "
                f"{results['session_tokens']} tokens)", ["request", "median ms", "p90 ms"],
                rows))
    out = ROOT / "bench" / "results" / "fake.json"
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
