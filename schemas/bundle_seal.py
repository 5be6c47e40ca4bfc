"""A session bundle's seal: which deployment wrote it, and that nothing changed since. No I/O.

Invariants:
- A seal is `ed25519:<public key>:<signature of a SHA-512 of the bundle's lines before its
  end line>`, written in the end line (`seal`) with the deployment's own key
  (`deployment_keys`, migration 014: made once, never leaves the database). The public
  key names the signer:
  this deployment, one it trusts (`KEEL_TRUSTED_BUNDLE_KEYS`, name=key, the key as
  `keel seal-key` prints it there), or another. Readers that know no seal ignore the field,
  so a sealed bundle is read by every Keel that reads its version.
- An import takes a bundle as this deployment's own only when its seal verifies with this
  deployment's key or a trusted one (`OWN`). Anything else (no seal, an untrusted
  deployment's, a seal that no longer matches its lines) is someone else's account of a
  session, and `--trust` is the person's word that it may be taken as its own:
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
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, NamedTuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from schemas.agent import AgentSpec
from schemas.attachments import files_tokens
from schemas.messages import HARNESS_PREFIX, MessageType
from schemas.tokens import count_tokens

KEY_NAME = "bundle-seal"
KEY_BYTES = 32  # an Ed25519 private key
SEAL_SCHEME = "ed25519"
# Signed with the lines' digest, so a seal signs a bundle and nothing else the key might.
SEAL_CONTEXT = b"keel-session-bundle-seal\n"


class Seal(StrEnum):
    HERE = "here"  # sealed by this deployment, unchanged since
    TRUSTED = "trusted"  # sealed by a deployment this one trusts, unchanged since
    ELSEWHERE = "elsewhere"  # sealed by a deployment this one does not trust
    CHANGED = "changed"  # sealed here or by a trusted deployment, changed since
    NONE = "none"  # not sealed (an older Keel's bundle, or one made by hand)


def seal_said(seal: Seal, by: str | None = None) -> str:
    """What an import found, in words: "the bundle was ..."."""
    if seal is Seal.TRUSTED:
        return f"sealed by {by}, a deployment this one trusts"
    if seal is Seal.CHANGED:
        return f"changed since {by or 'this deployment'} sealed it"
    return {Seal.HERE: "sealed by this deployment",
            Seal.ELSEWHERE: "sealed by a deployment this one does not trust",
            Seal.NONE: "not sealed"}[seal]


# What an import takes as this deployment's own without the importer's word.
OWN = frozenset({Seal.HERE, Seal.TRUSTED})


class SealCheck(NamedTuple):
    seal: Seal
    by: str | None = None  # the trusted deployment's name (TRUSTED, or CHANGED since it)


def _digest(body: bytes) -> bytes:
    """What a seal signs: a SHA-512 of the lines, in one pass and no copy of them (a bundle
    may hold a gigabyte)."""
    return hashlib.sha512(SEAL_CONTEXT + hashlib.sha512(body).digest()).digest()


def public_key(key: bytes) -> str:
    """The public half of a deployment's key, as hex: what another deployment trusts."""
    return Ed25519PrivateKey.from_private_bytes(key).public_key().public_bytes_raw().hex()


def seal_of(key: bytes, body: bytes) -> str:
    """The seal of a bundle whose lines before its end line are `body`."""
    signature = Ed25519PrivateKey.from_private_bytes(key).sign(_digest(body))
    return f"{SEAL_SCHEME}:{public_key(key)}:{signature.hex()}"


def check_seal(key: bytes, body: bytes, seal: str | None,
               trusted: Mapping[str, str] | None = None) -> SealCheck:
    """What `seal` says of `body` to the deployment holding `key` and trusting the public
    keys `trusted` (name -> hex)."""
    if not seal:
        return SealCheck(Seal.NONE)
    scheme, _, rest = seal.partition(":")
    signer, _, signature = rest.partition(":")
    own = public_key(key)
    by = next((name for name, hexed in (trusted or {}).items()
               if hexed.lower() == signer.lower()), None)
    if scheme != SEAL_SCHEME or (signer.lower() != own and by is None):
        return SealCheck(Seal.ELSEWHERE)
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(signer)).verify(
            bytes.fromhex(signature), _digest(body))
    except (ValueError, InvalidSignature):
        return SealCheck(Seal.CHANGED, by)
    return SealCheck(Seal.HERE) if signer.lower() == own else SealCheck(Seal.TRUSTED, by)


def trusted_keys_problem(keys: Mapping[str, str]) -> str | None:
    """Why a deployment cannot trust `keys` (name -> public key hex), or None."""
    for name, hexed in keys.items():
        if not name or any(c in name for c in "=,") or not name.isprintable():
            return f"a trusted deployment's name {name!r} is empty or holds '=', ',' or a " \
                   "control character"
        try:
            Ed25519PublicKey.from_public_bytes(bytes.fromhex(hexed))
        except ValueError:
            return (f"the key trusted as {name!r} is not a public key as `keel seal-key` "
                    "prints it (64 hex digits)")
    return None


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


def untrusted_text(check: SealCheck, agent_parts: list[str], memory: list[str]) -> str:
    """The refusal of a bundle that is not this deployment's own and would act here: what
    its agent would run or reach, what its memory would write."""
    ways = ["with --trust (trust=True) if you trust who made it and what it "
            + ("runs" if agent_parts else "remembers")]
    if agent_parts and not memory:
        ways.insert(0, "with an agent of your own (--agent FILE, agent=...)")
    if memory:
        ways.insert(0, "without its memory (--without-memory, with_memory=False)")
    return (f"the bundle is {seal_said(*check)}, and the session it holds would act in this "
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
            row["token_count"] = count_tokens(str(row.get("content_text") or "")) + files_tokens(
                row.get("content"))
        else:
            row["source_line"] = None
    return harness
