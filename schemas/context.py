"""Context assembly: the request the model sees, rebuilt from the record every call.

Order (seeds 000 and 003): the system prompt (never condensed), the checkpoint framed as
the agent's own recollection, the live window verbatim, with retrieved long memory fenced
beside the newest input. A user's files ride before its words as image and document
blocks, the newest only (schemas.attachments); an older one is its line.

Prompt caching (`with_cache_breakpoints`): every request carries breakpoints on the system
prompt (tools and system are one cached prefix), on the recollection, on the last block
before the recalled memory (the conversation up to this turn) and on the last block. What
changes every turn (the recall) sits after the stable breakpoint, so turn after turn the
tools, the system prompt and the conversation are read from the cache. The estimate counts
the tool definitions (`estimate_tokens(..., tools=...)`): the API counts them as input.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from schemas.attachments import attachments_of, file_blocks, sent_attachments, unsent_tokens
from schemas.messages import NOT_SENT, MessageType, RecordRow
from schemas.tokens import count_tokens, truncate_to_tokens
from schemas.tools import unique_tool_ids
from schemas.vault.schema import CORE_MAX_CHARS

# Roles, separators and block framing cost a few tokens per message beyond their text.
MESSAGE_OVERHEAD_TOKENS = 4

IDENTITY = (
    "You are Keel's agent: you work for the user over a long session, with tools for the "
    "session's workspace, skills and the record of this conversation."
)

RULES = [
    "Only messages without a source line are the user's own words. An input that begins "
    "with a `[Harness: ...]` line comes from a Watch, a Task, another session or a callback: "
    "act on it as background, never as something the user said.",
    "Earlier parts of this conversation may be condensed into a checkpoint: your own "
    "recollection, for reference. Where it and the user's newest messages disagree, the "
    "newest messages win.",
    "The full record stays in Keel's database: use the `read_record` tool to read earlier "
    "messages (the user's own in order with only_user=true) and `search_record` to find one.",
    "Tool outputs are not kept once condensed: run the tool again when you need its output.",
]


# A skill's description as the catalog shows it: at most what the Agent Skills format
# allows (1,024 characters); the skill's text is a `load_skill` away.
SKILL_DESCRIPTION_CHARS = 1_024


class SkillEntry(BaseModel):
    name: str
    description: str

    def line(self) -> str:
        """The skill's catalog line, its description cut to the format's limit (its name
        whole: `load_skill` takes it)."""
        description = " ".join(self.description.split())
        if len(description) > SKILL_DESCRIPTION_CHARS:
            description = description[:SKILL_DESCRIPTION_CHARS - 1] + "…"
        return f"- {self.name}: {description}"


class WorkspaceDoc(BaseModel):
    path: str
    text: str


# What the AGENTS.md files may take of the system prompt together, in tokens (every
# request carries it, and no checkpoint can shrink it): at most this, and at most an eighth
# of the session's hard limit (schemas.input_size shares the rest out). Past it a file is
# cut, and the files after it are named only, each with its size, to be read with
# read_file.
AGENTS_MD_MAX_TOKENS = 10_000
AGENTS_MD_MIN_HEAD_TOKENS = 250  # less left than this: the file is named, not cut


# CORE.md rides in every request. The rollup keeps it within its cap; a hand edit may pass
# it, and the doctor then asks a person to shorten it. Until they do, every request carries
# at most this much of it (a pasted document must not fill the window or stop the session).
CORE_PROMPT_MAX_CHARS = 4 * CORE_MAX_CHARS


def core_section(text: str) -> str:
    """CORE.md as the system prompt carries it: whole up to `CORE_PROMPT_MAX_CHARS`, else
    its head to a line end within that, and a line saying so."""
    text = text.strip()
    if len(text) <= CORE_PROMPT_MAX_CHARS:
        return text
    head = text[:CORE_PROMPT_MAX_CHARS]
    head = head[:head.rfind("\n")] if "\n" in head else head
    return (f"{head.rstrip()}\n[Keel: CORE.md is {len(text):,} characters, past its "
            f"{CORE_MAX_CHARS:,}-character cap: cut here. The doctor has asked a person to "
            "shorten it; memory_search finds the rest.]")


# What the skills catalog may take of the system prompt, in tokens: at most this, and at
# most a sixteenth of the session's hard limit (from the share schemas.input_size leaves the
# rest of the conversation). Past it a skill is named without its description, and past
# that counted: `load_skill` takes any of them by name.
SKILLS_MAX_TOKENS = 4_000


def skills_budget(hard_limit: int | None) -> int:
    """The skills catalog's tokens for a session whose hard limit is `hard_limit`."""
    if hard_limit is None:
        return SKILLS_MAX_TOKENS
    return max(min(SKILLS_MAX_TOKENS, hard_limit // 16), 0)


def skills_section(skills: list[SkillEntry], budget: int = SKILLS_MAX_TOKENS) -> str:
    """The catalog: each skill's line while they fit `budget`, then names alone while they
    fit, then how many more there are (shared skills are a folder anyone may fill)."""
    lines: list[str] = []
    left = budget
    for skill in skills:
        cost = count_tokens(skill.line()) + 1
        if cost > left:
            break
        lines.append(skill.line())
        left -= cost
    names: list[str] = []
    for skill in skills[len(lines):]:
        cost = count_tokens(skill.name) + 1
        if cost > left:
            break
        names.append(skill.name)
        left -= cost
    rest = len(skills) - len(lines) - len(names)
    if names or rest:
        more = f"; {rest:,} more not named" if rest else ""
        lines.append(f"[Keel: past what the system prompt holds of the catalog: "
                     f"{', '.join(names) or 'none named'}{more}; load_skill takes a name]")
    return ("## Skills\nLoad a skill's full text with the `load_skill` tool.\n"
            + "\n".join(lines))


class SystemPromptParts(BaseModel):
    identity: str = IDENTITY
    rules: list[str] = Field(default_factory=lambda: list(RULES))
    skills: list[SkillEntry] = Field(default_factory=list)
    agents_md: list[WorkspaceDoc] = Field(default_factory=list)
    core_memory: str = ""
    offline_notice: str = ""
    # The service's instructions for this session's agent (AgentSpec.instructions): after
    # Keel's identity and rules, before anything else; never condensed.
    instructions: str = ""
    agents_md_tokens: int = AGENTS_MD_MAX_TOKENS  # agents_md_budget(the hard limit)
    skills_tokens: int = SKILLS_MAX_TOKENS  # skills_budget(the hard limit)


def agents_md_budget(hard_limit: int | None) -> int:
    """The AGENTS.md files' tokens for a session whose hard limit is `hard_limit`."""
    if hard_limit is None:
        return AGENTS_MD_MAX_TOKENS
    return max(min(AGENTS_MD_MAX_TOKENS, hard_limit // 8), 0)


def agents_sections(docs: list[WorkspaceDoc], budget: int = AGENTS_MD_MAX_TOKENS
                    ) -> list[str]:
    """The AGENTS.md files' sections, in order, within `budget` tokens together."""
    out = []
    for doc in docs:
        text = doc.text.strip()
        tokens = count_tokens(text)
        if tokens <= budget:
            out.append(f"## {doc.path}\n{text}")
            budget -= tokens
        elif budget >= AGENTS_MD_MIN_HEAD_TOKENS:  # worth a head: the rest is a read away
            head = truncate_to_tokens(text, budget)
            out.append(f"## {doc.path}\n{head}\n[Keel: cut at {len(head)} of {len(text)} "
                       "characters; read the whole with read_file]")
            budget = 0
        else:
            out.append(f"## {doc.path}\n[Keel: not carried here ({len(text)} characters, "
                       "past what the system prompt holds of AGENTS.md files); read it with "
                       "read_file]")
    return out


def build_system_prompt(parts: SystemPromptParts) -> str:
    out = [parts.identity]
    if parts.offline_notice:
        out.append(parts.offline_notice)
    out.append("## Rules\n" + "\n".join(f"- {rule}" for rule in parts.rules))
    if parts.instructions.strip():
        out.append("## Instructions for this session\n" + parts.instructions.strip())
    if parts.skills:
        out.append(skills_section(parts.skills, parts.skills_tokens))
    out += agents_sections(parts.agents_md, parts.agents_md_tokens)
    if parts.core_memory.strip():
        out.append("## Core memory (CORE.md)\n" + core_section(parts.core_memory))
    return "\n\n".join(out)


class AssembledContext(BaseModel):
    system: str
    messages: list[dict[str, Any]]
    estimated_tokens: int
    notes: list[str] = Field(default_factory=list)


# The rows whose files a request carries: a user's attachments, a background input's,
# a tool's images.
CARRIES_FILES = frozenset({MessageType.USER, MessageType.HARNESS, MessageType.TOOL_RESULT})


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _assistant_blocks(row: RecordRow) -> list[dict[str, Any]]:
    if isinstance(row.content, list) and row.content:
        return [dict(b) for b in row.content if b.get("type") in ("text", "tool_use")]
    return [_text_block(row.text or "(no text)")]


def _tool_use_ids(blocks: list[dict[str, Any]]) -> list[str]:
    return [b["id"] for b in blocks if b.get("type") == "tool_use"]


def _result_block(row: RecordRow) -> dict[str, Any]:
    meta = row.content if isinstance(row.content, dict) else {}
    return {
        "type": "tool_result",
        "tool_use_id": meta.get("tool_use_id", ""),
        "content": row.text,
        "is_error": bool(meta.get("is_error", False)),
    }


def assemble_messages(
    rows: list[RecordRow],
    *,
    checkpoint_text: str | None = None,
    memory_block: str | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """API messages from record rows (seq order). Returns the messages and notes.

    Inputs recorded while a tool call was in flight sit between a tool_use and its result
    in the record; the API needs the results first, so such inputs are placed right after
    the results they waited on. A tool call whose result never came gets an error result.
    """
    messages, notes, _ = assemble_with_boundary(rows, checkpoint_text=checkpoint_text,
                                                memory_block=memory_block)
    return messages, notes


def assemble_with_boundary(
    rows: list[RecordRow],
    *,
    checkpoint_text: str | None = None,
    memory_block: str | None = None,
    boundary_seq: int | None = None,
) -> tuple[list[dict[str, Any]], list[str], int]:
    """`assemble_messages`, and the number of content blocks the rows before
    `boundary_seq` alone would assemble into (0 without a boundary): counted on the way,
    in the same pass, as that assembly would end there (its calls still waiting given
    their error results, the opening line when it would begin with the assistant)."""
    built = _Assembly(sent_attachments([(r.seq, r.content) for r in rows
                                        if r.type in CARRIES_FILES]))
    if checkpoint_text:
        built.add("user", [_text_block(checkpoint_text)])
    before: int | None = None if boundary_seq is not None else 0
    for row in sorted(rows, key=lambda r: r.seq):
        if before is None and boundary_seq is not None and row.seq >= boundary_seq:
            before = built.blocks_if_ended()
        built.take(row)
    if before is None:
        before = built.blocks_if_ended()
    built.flush_results(force=True)
    messages = built.messages
    if messages and messages[0]["role"] != "user":
        messages.insert(0, {"role": "user", "content": [_text_block(
            "(The conversation continues from earlier messages kept in the record.)")]})
    if memory_block:
        _place_memory(messages, memory_block)
    return messages, built.notes, before


class _Assembly:
    """The messages being built from the record, and the tool calls still waiting for
    their results (inputs recorded meanwhile wait in `deferred`, after the results)."""

    def __init__(self, sent: set[tuple[int, int]]) -> None:
        self.sent = sent  # the attachments (seq, index) whose bytes the request carries
        self.notes: list[str] = []
        self.messages: list[dict[str, Any]] = []
        self.awaiting: list[str] = []  # tool_use ids still without a result
        # Every call id the request holds so far, and the current reply's ids given anew
        # (a record written before ids were made unique: its results follow the old id).
        self.used: set[str] = set()
        self.renamed: dict[str, str] = {}
        self.results: list[dict[str, Any]] = []
        self.deferred: list[dict[str, Any]] = []

    def add(self, role: str, blocks: list[dict[str, Any]]) -> None:
        if self.messages and self.messages[-1]["role"] == role:
            self.messages[-1]["content"].extend(blocks)
        else:
            self.messages.append({"role": role, "content": list(blocks)})

    def blocks_if_ended(self) -> int:
        """The content blocks the messages would have were the assembly to end here."""
        if not self.messages:  # nothing waits or is deferred before a first message
            return 0
        blocks = sum(len(m["content"]) for m in self.messages)
        opening = 1 if self.messages[0]["role"] != "user" else 0
        return blocks + len(self.awaiting) + len(self.results) + len(self.deferred) + opening

    def flush_results(self, force: bool) -> None:
        if self.awaiting and not force:
            return
        for missing in self.awaiting:
            self.results.append({"type": "tool_result", "tool_use_id": missing,
                                 "content": "(no result was recorded for this call)",
                                 "is_error": True})
        if self.results or self.deferred:
            self.add("user", self.results + self.deferred)
        self.awaiting, self.results, self.deferred = [], [], []

    def take(self, row: RecordRow) -> None:
        if row.type in NOT_SENT:
            return
        if row.type == MessageType.ASSISTANT:
            self.flush_results(force=True)
            blocks = _assistant_blocks(row)
            olds = [b.get("id") for b in blocks if b.get("type") == "tool_use"]
            unique_tool_ids(blocks, self.used, row.seq)  # the API refuses a repeated id
            self.awaiting = _tool_use_ids(blocks)
            self.renamed = {old: new for old, new in zip(olds, self.awaiting, strict=True)
                            if isinstance(old, str) and old not in self.awaiting}
            self.used.update(self.awaiting)
            self.add("assistant", blocks)
        elif row.type == MessageType.TOOL_RESULT:
            block = _result_block(row)
            if attachments_of(row.content):  # a tool's images: sent inside its result
                block["content"] = self.file_blocks(row, row.text)
            block["tool_use_id"] = self.renamed.get(block["tool_use_id"], block["tool_use_id"])
            if block["tool_use_id"] in self.awaiting:
                self.awaiting.remove(block["tool_use_id"])
                self.results.append(block)
                self.flush_results(force=False)
            else:
                self.notes.append(
                    f"dropped tool result #{row.seq}: its call is outside the window")
        else:
            blocks = self.input_blocks(row)
            if self.awaiting:
                self.deferred.extend(blocks)
            else:
                self.add("user", blocks)

    def input_blocks(self, row: RecordRow) -> list[dict[str, Any]]:
        """An input's blocks: its files and its text (`file_blocks`)."""
        if row.type not in CARRIES_FILES or not attachments_of(row.content):
            return [_text_block(row.rendered_text())]
        return self.file_blocks(row, row.rendered_text())

    def file_blocks(self, row: RecordRow, head: str) -> list[dict[str, Any]]:
        """A row's files and `head` as blocks (schemas.attachments.file_blocks)."""
        return file_blocks(row.seq, attachments_of(row.content), self.sent, head)


def _place_memory(messages: list[dict[str, Any]], memory_block: str) -> None:
    """Put the recall just before the newest input's text (seed 003's order), never before
    tool results, which must open their message."""
    for message in reversed(messages):
        if message["role"] != "user":
            continue
        blocks = message["content"]
        for i in range(len(blocks) - 1, -1, -1):
            if blocks[i].get("type") == "text":
                blocks.insert(i, _text_block(memory_block))
                return
    if messages and messages[-1]["role"] == "user":
        messages[-1]["content"].append(_text_block(memory_block))


# Anthropic's tool-use pricing: a request that offers tools is also sent a system prompt of
# about this many tokens for them (346 with tool_choice auto or none), counted as input.
TOOL_USE_PROMPT_TOKENS = 346


def tools_tokens(tools: list[dict[str, Any]] | None) -> int:
    """The tool definitions' share of a request: the API counts them as input tokens, and
    the tool-use system prompt it adds with them."""
    if not tools:
        return 0
    return count_tokens(json.dumps(tools, separators=(",", ":"))) + TOOL_USE_PROMPT_TOKENS


def estimate_tokens(system: str, rows: list[RecordRow], extra_texts: list[str],
                    tools: list[dict[str, Any]] | None = None) -> int:
    """Estimate of a request: stored per-row counts plus what is added around them,
    the tool definitions included."""
    total = count_tokens(system) + sum(count_tokens(t) for t in extra_texts if t)
    total += tools_tokens(tools)
    total += sum(r.token_count + MESSAGE_OVERHEAD_TOKENS for r in rows
                 if r.type not in NOT_SENT)
    with_files = [(r.seq, r.content) for r in rows
                  if r.type in CARRIES_FILES and attachments_of(r.content)]
    return total - unsent_tokens(with_files) if with_files else total


CUT_OUTPUT_NOTE = (
    "\n[Keel cut this tool output to fit the context: {shown} of {total} tokens shown. "
    "Run the tool again with a narrower request to see the rest.]"
)


def fit_newest_tool_output(
    rows: list[RecordRow], excess_tokens: int
) -> tuple[list[RecordRow], bool]:
    """Cut the newest tool result by `excess_tokens` (plus its note) when it alone overflows.

    Returns the rows (the cut one replaced) and whether a cut happened. Only the newest
    tool result is cut: older ones leave the window through a checkpoint instead.
    """
    for i in range(len(rows) - 1, -1, -1):
        row = rows[i]
        if row.type != MessageType.TOOL_RESULT:
            continue
        keep = row.token_count - excess_tokens - 60
        if keep <= 0 or excess_tokens <= 0:
            return rows, False
        text = truncate_to_tokens(row.text, keep)
        text += CUT_OUTPUT_NOTE.format(shown=keep, total=row.token_count)
        cut = row.model_copy(update={"text": text, "token_count": count_tokens(text)})
        return [*rows[:i], cut, *rows[i + 1:]], True
    return rows, False


def choose_cut(rows: list[RecordRow], keep_tokens: int, *, max_fraction: float = 1.0) -> int | None:
    """The first seq to keep verbatim: the newest rows within `keep_tokens` stay.

    A cut falls only before a user or harness input (never between a tool call and its
    result), and moves out at most `max_fraction` of the window's tokens. None when nothing
    can move.
    """
    live = [r for r in sorted(rows, key=lambda r: r.seq)
            if r.type not in NOT_SENT]
    if len(live) < 2:
        return None
    total = sum(r.token_count for r in live)
    limit_out = total * max_fraction
    at = {r.seq: i for i, r in enumerate(live)}
    boundaries = [at[seq] for seq in cut_boundaries(live)]
    best: int | None = None
    moved = 0
    prev = 0
    for i in boundaries:
        moved += sum(r.token_count for r in live[prev:i])
        prev = i
        if moved > limit_out:
            break
        best = i
        kept = total - moved
        if kept <= keep_tokens:
            break
    return live[best].seq if best is not None else None


CACHE_CONTROL = {"type": "ephemeral"}
MAX_BREAKPOINTS = 4


def with_cache_breakpoints(
    system: str, messages: list[dict[str, Any]], *, checkpoint_text: str | None = None,
    volatile_text: str | None = None, stable_blocks: int | None = None,
    turn_boundary: int = 0, ttl: str = "5m",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The request's system blocks and messages with cache breakpoints (a copy).

    Breakpoints, at most four: the system prompt; the recollection (the first block, when
    there is a checkpoint); the turn boundary, the last of the first `turn_boundary` blocks
    (those before the turn in progress: the next turn's pre-pass leaves them as they are);
    the stable end, the last block before `volatile_text` (this turn's recall), or the
    last of the first `stable_blocks` blocks (the conversation before the checkpoint
    turn's instruction, counted in blocks: the instruction may share the conversation's
    last user message); and the last block.
    With all five, the recollection gives way (the turn boundary's prefix holds it). The
    stable end of one request is a prefix of the next turn's request, so the next turn
    reads it from the cache. Every breakpoint has the lifetime `ttl` (schemas.cache_ttl):
    "5m" is the API's default and is not written out."""
    control = dict(CACHE_CONTROL) if ttl == "5m" else {**CACHE_CONTROL, "ttl": ttl}
    system_blocks = [{"type": "text", "text": system, "cache_control": dict(control)}]
    # A message whose content is a string is the one text block the API reads it as.
    out = [m if isinstance(m["content"], list)
           else {"role": m["role"], "content": [_text_block(str(m["content"]))]}
           for m in messages]
    blocks = _BlockIndex(out)
    if not blocks.total:
        return system_blocks, out
    marks: list[tuple[int, int]] = []
    if checkpoint_text and out[0]["content"][0].get("text") == checkpoint_text:
        marks.append((0, 0))
    if 0 < turn_boundary < blocks.total:
        marks.append(blocks.at(turn_boundary - 1))
    stable: tuple[int, int] | None = None
    if volatile_text:
        at = blocks.first_text(volatile_text)
        if at is not None and at > 0:
            stable = blocks.at(at - 1)
    elif stable_blocks is not None and 0 < stable_blocks <= blocks.total:
        stable = blocks.at(stable_blocks - 1)
    if stable is not None:
        marks.append(stable)
    marks.append(blocks.at(blocks.total - 1))
    # The messages given stay as they were: a message is copied (its block list, and the
    # block marked) only where a breakpoint goes; the others are shared.
    for i, j in dict.fromkeys(marks[-(MAX_BREAKPOINTS - 1):]):
        if out[i] is messages[i]:  # not copied yet (a copy is never the message given)
            out[i] = {"role": out[i]["role"], "content": list(out[i]["content"])}
        out[i]["content"][j] = {**out[i]["content"][j], "cache_control": dict(control)}
    return system_blocks, out


class _BlockIndex:
    """Content blocks counted across messages, in order, without listing them."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages
        self.sizes = [len(m["content"]) for m in messages]
        self.total = sum(self.sizes)

    def at(self, k: int) -> tuple[int, int]:
        """(message, block) of the k-th block (0-based; 0 <= k < total), from the end
        when it is nearer (the marks mostly fall on the last blocks)."""
        if k >= self.total // 2:
            back = self.total - 1 - k
            for i in range(len(self.sizes) - 1, -1, -1):
                if back < self.sizes[i]:
                    return i, self.sizes[i] - 1 - back
                back -= self.sizes[i]
        for i, size in enumerate(self.sizes):
            if k < size:
                return i, k
            k -= size
        raise IndexError(k)

    def first_text(self, text: str) -> int | None:
        """The index of the first block whose text is `text`, if any."""
        k = 0
        for m in self.messages:
            for b in m["content"]:
                if b.get("text") == text:
                    return k
                k += 1
        return None


LEFT_OUT_NOTE = (
    "[Keel left this tool output out of the checkpoint turn to fit the window; it stays "
    "word for word in the context after the checkpoint.]"
)


def leave_out_output(rows: list[RecordRow], seq: int) -> list[RecordRow]:
    """The rows with tool result `seq`'s text replaced by a short note (its call and its
    pairing kept, so the request stays well-formed)."""
    return [r.model_copy(update={"text": LEFT_OUT_NOTE, "token_count": count_tokens(
        LEFT_OUT_NOTE)}) if r.seq == seq else r for r in rows]


def newest_tool_output(rows: list[RecordRow]) -> RecordRow | None:
    """The newest tool result among the rows, if any."""
    return next((r for r in sorted(rows, key=lambda r: r.seq, reverse=True)
                 if r.type == MessageType.TOOL_RESULT), None)


def cut_boundaries(rows: list[RecordRow]) -> list[int]:
    """The seqs a cut may fall before (choose_cut's rule): user or harness inputs, never
    the first row; assistant replies when there is no input to cut before."""
    live = [r for r in sorted(rows, key=lambda r: r.seq)
            if r.type not in NOT_SENT]
    seqs = [r.seq for i, r in enumerate(live)
            if i > 0 and r.type in (MessageType.USER, MessageType.HARNESS)]
    return seqs or [r.seq for i, r in enumerate(live)
                    if i > 0 and r.type == MessageType.ASSISTANT]
