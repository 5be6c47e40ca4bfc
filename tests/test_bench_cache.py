"""The cache benchmark's rewrite accounting (pure: request bodies and the fake's cache, no
server): content sent before and written again behind a changed prefix is a rewrite; new
content is not; a prefix read from the cache is neither."""

from __future__ import annotations

from typing import Any

from activities.offline.blocks import prompt_blocks
from activities.offline.cache import PromptCache
from bench.bench_cache import rewrites

LONG = " ".join(f"word{i}" for i in range(1_500))  # past the minimum cacheable prefix


def _body(*texts: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": t} for t in texts]
    content[-1]["cache_control"] = {"type": "ephemeral"}
    return {"model": "claude-sonnet-4-5", "max_tokens": 10, "system": "sys",
            "messages": [{"role": "user", "content": content}]}


def test_content_written_again_behind_a_new_prefix_counts_as_rewritten():
    bodies = [
        _body(f"one {LONG}", f"two {LONG}"),  # all new
        _body(f"one {LONG}", f"two {LONG}", f"three {LONG}"),  # reads 1-2, writes 3 (new)
        _body(f"summary {LONG}", f"three {LONG}"),  # a new head: 3 is written again
    ]
    cache = PromptCache(clock=lambda: 0.0)
    usages = [cache.account(b, prompt_blocks(b), min_tokens=1_024) for b in bodies]
    rows = rewrites(bodies, usages)
    assert [r["rewritten"] for r in rows[:2]] == [0, 0]
    assert rows[1]["read"] == rows[1]["shared"] > 0 and rows[1]["write"] > 0
    system, summary, three = (b.tokens for b in prompt_blocks(bodies[2]))
    # Nothing read (no breakpoint ended at the system prompt): the system prompt and the
    # third text are written again, the summary is new.
    assert rows[2]["read"] == 0 and rows[2]["write"] == system + summary + three
    assert rows[2]["rewritten"] == system + three
    assert rows[2]["first_new"] == "messages.0.content.0"
