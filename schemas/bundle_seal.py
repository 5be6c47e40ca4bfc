"""A session bundle's seal: whether this deployment wrote it, unchanged. No I/O.

Invariants:
- A seal is `<key id>:<HMAC-SHA256 of the bundle's lines before its end line>`, written in
  the end line (`seal`) with the deployment's own key (`deployment_keys`, migration 014).
  The key id is a digest of the key, never the key: it tells "sealed by another
  deployment" from "changed since this one sealed it". Readers that know no seal ignore
  the field, so a sealed bundle is read by every Keel that reads its version.
- An import takes a bundle as this deployment's own only when its seal verifies here
  (`Seal.HERE`). Anything else (no seal, another deployment's, a seal that no longer
  matches) is someone else's account of a session, and `--trust` is the person's word that
  it may be taken as its own:
  - its session's agent may not run a command, reach a server or call a service of this
    deployment without that word (`acting_parts` names each: an MCP server, with the
    worker's variables it would pass on, a service tool), so opening a bundle never runs
    what it carries; the importer may give the session an agent of their own instead;
  - its long memory (cards, daily-note entries) is not written into a scope every session
    of it recalls from without that word either (`memory_parts`);
  - its harness rows keep their text, and their source line says they were imported
    unverified (`unverified_source_line`), so no bundle passes its text for a Watch, Task,
    agent run or callback this deployment received; a user's row gets its source line as
    a received message does, and no other row keeps one (`unverified_rows`).
"""

from __future__ import annotations

import hashlib
import hmac
from enum import StrEnum
from typing import Any

from schemas.agent import AgentSpec
from schemas.messages import HARNESS_PREFIX, MessageType
from schemas.tokens import count_tokens

KEY_NAME = "bundle-seal"
KEY_BYTES = 32
_ID_CHARS = 16


class Seal(StrEnum):
    HERE = "here"  # sealed by this deployment, unchanged since
    ELSEWHERE = "elsewhere"  # sealed by another deployment's key
    CHANGED = "changed"  # sealed by this deployment, changed since
    NONE = "none"  # not sealed (an older Keel's bundle, or one made by hand)


SEAL_SAID = {
    Seal.HERE: "sealed by this deployment",
    Seal.ELSEWHERE: "sealed by another deployment",
    Seal.CHANGED: "changed since this deployment sealed it",
    Seal.NONE: "not sealed",
}


def key_id(key: bytes) -> str:
    """The public name of a key: a digest, from which the key cannot be had."""
    return hashlib.sha256(b"keel-bundle-seal-id:" + key).hexdigest()[:_ID_CHARS]


def seal_of(key: bytes, body: bytes) -> str:
    """The seal of a bundle whose lines before its end line are `body`."""
    return f"{key_id(key)}:{hmac.new(key, body, hashlib.sha256).hexdigest()}"


def check_seal(key: bytes, body: bytes, seal: str | None) -> Seal:
    """What `seal` says of `body` to the holder of `key`."""
    if not seal:
        return Seal.NONE
    named, _, _ = seal.partition(":")
    if not hmac.compare_digest(named, key_id(key)):
        return Seal.ELSEWHERE
    return Seal.HERE if hmac.compare_digest(seal, seal_of(key, body)) else Seal.CHANGED


def acting_parts(agent: AgentSpec | None) -> list[str]:
    """What a session with `agent` would run or reach in the deployment that starts it."""
    if agent is None:
        return []
    parts: list[str] = []
    for server in agent.mcp_servers:
        if server.stdio is not None:
            what = f"MCP server {server.name!r} runs {server.stdio.command!r} on the worker"
            passed = server.stdio.env_names
        else:
            assert server.http is not None  # exactly one transport (McpServerSpec)
            what = f"MCP server {server.name!r} is reached at {server.http.url!r}"
            passed = sorted(server.http.header_env.values())
        if passed:
            what += f" with the worker's {', '.join(passed)}"
        parts.append(what)
    parts += [f"service tool {t.name!r} calls {t.activity!r} on task queue {t.task_queue!r}"
              for t in agent.tools]
    return parts


def memory_parts(scope: str | None, cards: int, entries: int) -> list[str]:
    """What a bundle's long memory would write here: into a scope every session of it
    recalls from."""
    if not cards and not entries:
        return []
    return [f"it writes {cards} card(s) and {entries} daily-note entries into memory scope "
            f"{scope!r}, which every session of that scope recalls"]


def untrusted_text(seal: Seal, agent_parts: list[str], memory: list[str]) -> str:
    """The refusal of a bundle that is not this deployment's own and would act here: what
    its agent would run or reach, what its memory would write."""
    ways = ["with --trust (trust=True) if you trust who made it and what it "
            + ("runs" if agent_parts else "remembers")]
    if agent_parts and not memory:
        ways.insert(0, "with an agent of your own (--agent FILE, agent=...)")
    if memory:
        ways.insert(0, "without its memory (--without-memory, with_memory=False)")
    return (f"the bundle is {SEAL_SAID[seal]}, and the session it holds would act in this "
            f"deployment: {'; '.join(agent_parts + memory)}. Import it "
            + ", or ".join(ways))


def unverified_source_line(line: str | None) -> str:
    """A harness row's source line as an unverified import gives it: Keel's own line,
    the line the bundle had quoted inside it as data."""
    said = " ".join((line or "").split())
    if said.startswith(HARNESS_PREFIX) and said.endswith("]"):
        said = said[len(HARNESS_PREFIX):-1].strip()
    said = said.replace('"', "'").replace("]", ")").replace("[", "(")
    return f'[Harness: imported, unverified: "{said or "no source line"}"]'


def unverified_rows(rows: list[dict[str, Any]]) -> int:
    """The rows of a bundle not this deployment's own, labelled as such (in place): each
    harness row's source line says it was imported unverified (its token count made again
    with it); a user's row loses any source line it came with, for the import to decide
    as it decides one received (`activities.bundle._unforged`); a row of a kind that never
    carries one (an assistant's, a tool result's) loses it. Returns the harness rows."""
    harness = 0
    for row in rows:
        kind = row.get("type")
        if kind == MessageType.HARNESS.value:
            line = row["source_line"] = unverified_source_line(row.get("source_line"))
            row["token_count"] = count_tokens(f"{line} {row.get('content_text') or ''}")
            harness += 1
        elif kind == MessageType.USER.value and row.get("source_line"):
            row["source_line"] = None
            row["token_count"] = count_tokens(str(row.get("content_text") or ""))
        else:
            row["source_line"] = None
    return harness
