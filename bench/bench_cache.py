"""Prompt-cache benchmark: how much of a long session's input is read from the cache.

    .venv/bin/python bench/bench_cache.py                  # 200 turns on a 200k window
    .venv/bin/python bench/bench_cache.py --turns 60       # a quicker look

The memory benchmark's PR-queue session (window-sized tool outputs, a mind near its
limits) runs against the fake Messages API (tests/fake_anthropic), which implements
Anthropic's prompt-caching accounting: breakpoints, at most 4, the minimum cacheable
length, the 20-block lookback, TTLs. The offline deterministic model writes the replies;
the fake counts every request's `usage` (input, cache write, cache read) as the API would.

Figures: the share of input tokens read from the cache; billed input tokens per plain
turn and per checkpoint (a checkpoint: every request of its turn and repair), with caching
(input x1, cache write x1.25, cache read x0.1) against the same requests without caching
(every input token x1). Written to stdout and bench/results/cache.json.

Rewrites: a block written to the cache whose content an earlier request had already sent
(behind a different prefix) is a rewrite, the rest of a write is new content. The figures
count both, and the share the session would read were nothing ever rewritten (its
ceiling at these reads). `--dump PATH` writes one line per request (its kind, size, read,
write, rewritten tokens and the first block no earlier request had behind the same prefix).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from activities.db import close_pools  # noqa: E402
from activities.offline import respond  # noqa: E402
from activities.offline.accounting import message_blocks, system_blocks  # noqa: E402
from activities.offline.blocks import _content_key, prompt_blocks  # noqa: E402
from activities.offline.cache import CacheUsage  # noqa: E402
from bench.common import cancel_on_sigterm, source_commit  # noqa: E402
from bench.memory_benchmark import say  # noqa: E402
from bench.memory_drive import Scenario, drive, stop_embedded_postgres  # noqa: E402
from keel.client import KeelClient  # noqa: E402
from keel.devstack import running_stack  # noqa: E402
from schemas.checkpoint.request import REQUEST_MARKER  # noqa: E402
from schemas.config import KeelSettings, ModelSettings  # noqa: E402
from schemas.vault.rollup import RollupKind, request_kind  # noqa: E402
from tests.fake_anthropic import FakeAnthropic  # noqa: E402
from workers.worker import build_worker  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "cache.json"
MODEL = "claude-sonnet-4-5"  # the fake's Sonnet limits: 1,024-token minimum cacheable prefix
WRITE_PRICE, READ_PRICE = 1.25, 0.1


def responder(body: dict[str, Any]) -> dict[str, Any]:
    """The offline model's answer; its usage is the fake's, as the API counts it (every
    block, the tool definitions and the tool-use prompt, the cache's reads and writes)."""
    return respond(body)


def kind_of(body: dict[str, Any]) -> str:
    """turn, checkpoint (its turn and repair), flush (the memory flush before it), other."""
    found = request_kind(body)
    if found is not None:
        return "flush" if found[0] is RollupKind.FLUSH else "other"
    text = json.dumps(body.get("messages", []))
    if REQUEST_MARKER in text:
        return "checkpoint"
    names = {t.get("name") for t in body.get("tools", [])}
    return "turn" if "read_record" in names else "other"


def billed(read: int, write: int, plain: int) -> float:
    return plain + WRITE_PRICE * write + READ_PRICE * read


def _contents(body: dict[str, Any]) -> list[bytes]:
    """Each prompt block's own content (no prefix), in `prompt_blocks` order."""
    out = [b"tool:" + _content_key(t) for t in body.get("tools") or [] if isinstance(t, dict)]
    out += [b"system:" + _content_key(b) for b in system_blocks(body)]
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            out += [f"{message.get('role')}:".encode() + _content_key(b)
                    for b in message_blocks(message)]
    return out


def rewrites(requests: list[dict[str, Any]],
             usages: list[CacheUsage]) -> list[dict[str, Any]]:
    """Per request: its kind, size, read and write, how much of the write is content an
    earlier request sent already (`rewritten`), the longest prefix any earlier request
    shared (`shared`: what the cache could have read) and the first block no earlier
    request had behind the same prefix (`first_new`)."""
    prefixes: set[str] = set()
    sent: set[bytes] = set()
    rows = []
    for i, (body, usage) in enumerate(zip(requests, usages, strict=False)):
        blocks, contents = prompt_blocks(body), _contents(body)
        at = shared = rewritten = 0
        first_new = None
        for block, content in zip(blocks, contents, strict=True):
            start, at = at, at + block.tokens
            if block.prefix_hash in prefixes:
                shared = at
            elif first_new is None:
                first_new = block.where
            written = min(at, usage.cache_read + usage.cache_creation) - max(
                start, usage.cache_read)
            if written > 0 and content in sent:
                rewritten += written
        prefixes.update(b.prefix_hash for b in blocks)
        sent.update(contents)
        rows.append({"i": i, "kind": kind_of(body), "tokens": at, "read": usage.cache_read,
                     "write": usage.cache_creation, "rewritten": rewritten, "shared": shared,
                     "first_new": first_new})
    return rows


async def run(args: argparse.Namespace) -> dict[str, Any]:
    cancel_on_sigterm()
    commit = source_commit()  # the code measured: read before the run, not after it
    fake = FakeAnthropic(responder, context_window=args.window).start()
    tmp = Path(tempfile.mkdtemp(prefix="keel-cache-bench-"))
    settings = KeelSettings(
        data_dir=tmp, task_queue=f"bench-{uuid.uuid4().hex[:8]}",
        model=ModelSettings(name=MODEL, base_url=fake.base_url, api_key="bench-key",
                            context_window=args.window, max_output_tokens=args.max_output,
                            request_timeout_s=60))
    started = time.perf_counter()
    try:
        async with running_stack(settings) as stack:
            settings = settings.model_copy(update={"database_url": stack.database_url})
            async with build_worker(stack.client, settings):
                keel = KeelClient(stack.client, settings.task_queue, settings)
                d = await drive(keel, settings, Scenario("plain-queue", args.turns), args.window,
                                args.max_output)
    finally:
        await close_pools()
        stop_embedded_postgres(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        fake.stop()
    seconds = time.perf_counter() - started
    per: dict[str, dict[str, int]] = {}
    dumped = rewrites(fake.requests, fake.usages)
    for usage, row in zip(fake.usages, dumped, strict=False):
        k = per.setdefault(row["kind"], {"requests": 0, "read": 0, "write": 0, "input": 0,
                                         "rewritten": 0})
        k["requests"] += 1
        k["read"] += usage.cache_read
        k["write"] += usage.cache_creation
        k["input"] += usage.input
        k["rewritten"] += row["rewritten"]
    if args.dump:
        Path(args.dump).write_text("".join(json.dumps(r) + "\n" for r in dumped))
    total = {f: sum(v[f] for v in per.values())
             for f in ("requests", "read", "write", "input", "rewritten")}
    all_input = total["read"] + total["write"] + total["input"]
    checkpoints = len(d.snapshots) and d.snapshots[-1].checkpoint_count
    turns = max(1, d.asks)

    def costs(k: dict[str, int], n: int) -> dict[str, float]:
        cached = billed(k["read"], k["write"], k["input"]) / max(1, n)
        uncached = (k["read"] + k["write"] + k["input"]) / max(1, n)
        return {"billed_with_cache": round(cached), "billed_without_cache": round(uncached),
                "ratio": round(cached / max(1.0, uncached), 3)}

    session_only = {f: sum(v[f] for kind, v in per.items() if kind not in ("flush", "other"))
                    for f in ("read", "write", "input")}
    none = {"read": 0, "write": 0, "input": 0}
    with_flush = {f: per.get("checkpoint", none)[f] + per.get("flush", none)[f]
                  for f in ("read", "write", "input")}
    out = {
        "benchmark": "cache",
        "machine": {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                    "cpus": os.cpu_count(), "python": platform.python_version(),
                    "commit": commit},
        "model": MODEL, "window": args.window, "max_output_tokens": args.max_output,
        "turns": d.asks, "checkpoints": checkpoints, "errors": d.errors,
        "seconds": round(seconds, 1), "by_kind": per, "total": total,
        "cache_read_share": round(total["read"] / max(1, all_input), 4),
        # The share at these reads were no content ever written to the cache twice.
        "cache_read_share_without_rewrites": round(
            total["read"] / max(1, all_input - total["rewritten"]), 4),
        # The session's own requests (turns and checkpoints), without the memory flushes.
        "cache_read_share_session_requests": round(
            session_only["read"] / max(1, sum(session_only.values())), 4),
        "per_turn": costs(per.get("turn", {"read": 0, "write": 0, "input": 0}), turns),
        "per_checkpoint": costs(per.get("checkpoint", none), checkpoints or 1),
        # The checkpoint's requests and the memory flush before it.
        "per_checkpoint_with_flush": costs(with_flush, checkpoints or 1),
        "per_flush": costs(per.get("flush", none), per.get("flush", {}).get("requests", 0)),
        "whole_session": costs(total, 1),
    }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--window", type=int, default=200_000)
    p.add_argument("--max-output", type=int, default=8_192)
    p.add_argument("--dump", default="", help="write one JSON line per request here")
    args = p.parse_args()
    out = asyncio.run(run(args))
    say(f"{out['turns']} turns, {out['checkpoints']} checkpoints on a {out['window']:,} window "
        f"({out['seconds']} s); errors: {out['errors'] or 'none'}")
    for kind, k in out["by_kind"].items():
        say(f"  {kind:<10} {k['requests']:>4} requests  read {k['read']:>11,}  "
            f"write {k['write']:>10,} (rewritten {k['rewritten']:>8,})  "
            f"uncached {k['input']:>10,}")
    say(f"input tokens read from the cache: {out['cache_read_share']:.1%} of all requests, "
        f"{out['cache_read_share_session_requests']:.1%} of the session's own (turns and "
        "checkpoints; 'flush' is the memory flush before each checkpoint); "
        f"{out['cache_read_share_without_rewrites']:.1%} were nothing rewritten")
    for label in ("per_turn", "per_checkpoint", "per_checkpoint_with_flush", "per_flush",
                  "whole_session"):
        c = out[label]
        say(f"  billed input tokens {label.replace('_', ' ')}: {c['billed_with_cache']:,} with "
            f"caching vs {c['billed_without_cache']:,} without (x{c['ratio']})")
    custom = (args.turns, args.window, args.max_output) != (200, 200_000, 8_192)
    path = RESULTS.with_name("cache-custom.json") if custom else RESULTS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    say(f"figures written to {path.relative_to(ROOT)} at commit {out['machine']['commit']}")


if __name__ == "__main__":
    main()
