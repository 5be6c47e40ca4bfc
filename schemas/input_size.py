"""How large one input may be in a session's context: one rule for a user's message and for a
background input (a Watch, a Task, an agent run, a callback).

Invariants (pure, deterministic: the workflow applies them). The window's hard limit (what
a request may have, a full reply aside) is shared out so that no part at its own limit can
leave the others no room: an input at most a half, what the agent adds to every request a
quarter, its AGENTS.md files an eighth (schemas.context.agents_md_budget); the last eighth
and more is the rest of the conversation's (core memory, at most a sixteenth for the skills
catalog (schemas.context.skills_budget), a checkpoint's text, recalled memory, the turn's
own calls).
- An input within the limits has at most `max_chars` characters and at most half the
  hard limit in tokens (`schemas.tokens.count_tokens`), so a checkpoint can always make it
  fit.
- A user's message over them is refused: its sender is told (`over_limits`' words).
- A background input over them has nobody to tell, and losing it would lose what the
  sender said: it is recorded cut to `kept_prefix` (within both limits, with room for the
  line saying where the rest is) and kept whole in the session's workspace.
- What every request carries whatever the conversation (the system prompt with the agent's
  instructions, the tool definitions) may take at most a quarter of it (`agent_share`):
  an agent over it is refused at start and by `set_agent` (`agent_fit_problem`), where
  before its session stopped on its first message, saying the conversation had grown too
  long; so is a session without one whose window leaves Keel's own prompt no room, or
  whose full reply leaves the request nothing. MCP tools, listed later, are kept in the
  order listed while they fit it (`fit_mcp_tools`).
"""

from __future__ import annotations

import json

from pydantic import BaseModel

from schemas.agent import AgentSpec, session_tools
from schemas.context import SystemPromptParts, build_system_prompt
from schemas.mcp import McpTool
from schemas.messages import MessageType
from schemas.model import TooLong
from schemas.session import SessionConfig
from schemas.tokens import count_tokens, truncate_to_tokens
from schemas.tools import AGENT_TOOLS

__all__ = [
    "CUT_LINE_CHARS",
    "CUT_LINE_ROOM",
    "CUT_REASON_CHARS",
    "CUT_REASON_TOKENS",
    "InputLimits",
    "LargestPart",
    "agent_fit_problem",
    "agent_share",
    "agent_tokens",
    "config_fit_problem",
    "cut_line",
    "fit_mcp_tools",
    "input_limits",
    "kept_prefix",
    "over_limits",
    "room_taken",
]

# What is kept free under the limits for the line a cut input ends with (its counts, and
# where the whole is or why it could not be kept, that reason cut to CUT_REASON_CHARS).
CUT_LINE_ROOM = 100  # tokens
CUT_LINE_CHARS = 400
CUT_REASON_CHARS = 200
CUT_REASON_TOKENS = 60


class InputLimits(BaseModel):
    chars: int
    tokens: int


def input_limits(max_chars: int, hard_limit: int) -> InputLimits:
    """The limits for a session whose window's hard limit is `hard_limit` tokens."""
    return InputLimits(chars=max_chars, tokens=max(hard_limit // 2, 1))


def over_limits(text: str, limits: InputLimits) -> str | None:
    """What is too much about `text` ("N characters; the limit is M" or the tokens'), or
    None when it is within both limits."""
    if len(text) > limits.chars:
        return f"{len(text)} characters; the limit is {limits.chars}"
    tokens = count_tokens(text)
    if tokens > limits.tokens:
        return f"{tokens} tokens; on this model one may have at most {limits.tokens}"
    return None


def kept_prefix(text: str, limits: InputLimits) -> str:
    """The longest prefix of `text` a cut input keeps: within both limits, with room for
    its cut line."""
    head = text[:max(limits.chars - CUT_LINE_CHARS, 0)]
    return truncate_to_tokens(head, max(limits.tokens - CUT_LINE_ROOM, 0))


def cut_line(kept: int, whole: int, where: str) -> str:
    """The line a cut input ends with: how much of it is here and where the rest is."""
    short = truncate_to_tokens(where[:CUT_REASON_CHARS - 1], CUT_REASON_TOKENS)
    if short != where:
        where = short + "…"
    return f"\n[Keel: input cut at {kept} of {whole} characters; {where}]"


def _fixed_text(spec: AgentSpec | None) -> tuple[str, str]:
    """Keel's system prompt with `spec`'s instructions, and the tool definitions as sent (the
    built-ins and its service tools; MCP tools are listed later, and long memory's few are
    left out)."""
    system = build_system_prompt(SystemPromptParts(
        instructions=spec.instructions if spec else ""))
    tools = session_tools(list(AGENT_TOOLS), spec, [])
    return system, json.dumps(tools, ensure_ascii=False)


def agent_tokens(spec: AgentSpec | None) -> int:
    """What `spec` adds to every request (None: a session without an agent, Keel's own
    prompt and built-in tools)."""
    return _tokens(_fixed_text(spec))


def _tokens(texts: tuple[str, str]) -> int:
    return sum(count_tokens(text) for text in texts)


def agent_share(hard_limit: int) -> int:
    """What the agent may add to every request: a quarter of the hard limit."""
    return max(hard_limit // 4, 1)


def agent_fit_problem(spec: AgentSpec | None, context_window: int, hard_limit: int
                      ) -> str | None:
    """Why a session with a window of `context_window` tokens (its hard limit
    `hard_limit`: the window less a full reply) cannot run `spec` (None: no agent), or
    None."""
    if hard_limit <= 0:
        return (f"a reply of up to {context_window - hard_limit} tokens leaves nothing of a "
                f"window of {context_window} tokens for the request: give the session a "
                "larger window or a smaller max_output_tokens")
    limit, texts = agent_share(hard_limit), _fixed_text(spec)
    # A token is at least one byte: text of at most `limit` bytes fits uncounted (a
    # client need not load the tokenizer for a session of a usual window).
    if sum(len(text.encode("utf-8", "surrogatepass")) for text in texts) <= limit:
        return None
    tokens = _tokens(texts)
    if tokens <= limit:
        return None
    what = ("the agent's instructions and tool definitions take" if spec else
            "Keel's system prompt and built-in tool definitions take")
    them = " with Keel's system prompt" if spec else ""
    fix = "shorten them, or give the session a larger window" if spec else \
        "give the session a larger window"
    return (f"{what} {tokens} tokens{them}; a session with a window of {context_window} "
            f"tokens may give them at most {limit}, to leave room for the conversation: "
            f"{fix}")


def config_fit_problem(config: SessionConfig) -> str | None:
    """`agent_fit_problem` for a session's config, with or without its agent."""
    return agent_fit_problem(config.agent, config.context_window, config.window().hard_limit)


def fit_mcp_tools(spec: AgentSpec, tools: list[McpTool], hard_limit: int
                  ) -> tuple[list[McpTool], list[str]]:
    """The MCP tools a session can carry, in the order listed, while the agent's share of
    every request stays within `agent_share`; and the names of those left out."""
    used, limit = agent_tokens(spec), agent_share(hard_limit)
    kept: list[McpTool] = []
    left: list[str] = []
    for tool in tools:
        cost = count_tokens(json.dumps(tool.to_anthropic(), ensure_ascii=False))
        if used + cost <= limit:
            kept.append(tool)
            used += cost
        else:
            left.append(tool.name)
    return kept, left


class LargestPart(BaseModel):
    """The largest row of a request that cannot be sent, by Keel's estimate: what a person
    reads in the stop's notice to see what took the room (and where to fork before)."""

    seq: int
    type: MessageType
    tokens: int


_PART_NAMES = {MessageType.USER: "a message of the user", MessageType.HARNESS:
               "a background input", MessageType.ASSISTANT: "a reply of the model",
               MessageType.TOOL_RESULT: "a tool's result"}


def room_taken(estimate: int, hard_limit: int, fixed: int,
               refused: TooLong | None = None, largest: LargestPart | None = None) -> str:
    """What a request that cannot be sent takes, for the notice of a stop: its size (the
    API's count when it refused it, else Keel's estimate) against what one may have, how
    much of it every request carries, and the largest of the rest."""
    counted, maximum = (refused.prompt_tokens, refused.maximum) if refused else (None, None)
    size = (f"the API counted {counted:,} tokens against its {maximum:,}"
            if counted and maximum else f"about {estimate:,} tokens of the {hard_limit:,} "
                                        "one may have")
    said = (f"The next request: {size}; about {fixed:,} of them are what every request "
            "carries (Keel's system prompt with the agent's instructions and AGENTS.md "
            "files, and the tool definitions).")
    if largest is not None:
        said += (f" The largest of the rest is #{largest.seq}, "
                 f"{_PART_NAMES.get(largest.type, str(largest.type))}: about "
                 f"{largest.tokens:,} tokens.")
    return said
