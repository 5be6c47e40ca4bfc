"""The checkpoint activities' payloads: they travel through Temporal, and a checkpoint
attempt keeps its own input (`PrepareInput`, as prepare left it) as the first entry of its
rounds in `checkpoint_attempts`, so every later step reads the same input back (keel.record
reads it too). Fields are only ever added, optional with defaults.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from schemas.agent import AgentSpec
from schemas.budget import Spend
from schemas.checkpoint.budgets import CheckpointBudgets
from schemas.checkpoint.policy import ModelWindow
from schemas.checkpoint.problems import Problem
from schemas.mcp import McpTool
from schemas.model import TooLong

__all__ = [
    "CheckResult", "MoveInput", "PrepareInput", "PrepareResult", "PreviousCheckpoint",
    "RoundInput", "RoundResult", "StoreInput", "StoreResult", "WindowRef",
    "checkpoint_id_for",
]


class WindowRef(BaseModel):
    """The live window a checkpoint (or the move) is taken over, and the model's sizes."""

    session_id: str
    attempt_id: str
    window_start_seq: int
    upto_seq: int
    checkpoint_id: str | None = None
    turn_first_seq: int
    window: ModelWindow
    user_name: str = "user"
    # The session's agent and MCP tools: the checkpoint turn carries the same system prompt
    # (instructions included) and tools as the request it interrupts.
    agent: AgentSpec | None = None
    mcp_tools: list[McpTool] = Field(default_factory=list)

    def budgets(self) -> CheckpointBudgets:
        return CheckpointBudgets.for_model(self.window)

    @property
    def instructions(self) -> str:
        return self.agent.instructions if self.agent else ""


class PrepareInput(WindowRef):
    model: str
    portion: float = 1.0  # the most it condenses; after prepare, the share it was shown
    view: str = "full"  # schemas.checkpoint.policy.CheckpointView, chosen by prepare
    omit_seq: int | None = None  # the newest tool output left out of the turn's view
    usage_ratio: float = 1.0  # the API's count over Keel's estimate, as call_model uses it
    # Prepare's estimate of the turn's first request (the ratio applied), before any round
    # tells the API's own count: the rounds size themselves from it (activities.
    # checkpoint_turn).
    first_request_tokens: int = 0


class PrepareResult(BaseModel):
    ok: bool
    reason: str = ""
    cut_seq: int = 0
    candidates: int = 0
    view: str = "full"  # what the checkpoint turn is shown (schemas.checkpoint.policy)


class RoundInput(BaseModel):
    attempt_id: str
    round_no: int
    repair: bool = False
    final: bool = False


class RoundResult(BaseModel):
    done: bool
    tool_calls: int = 0
    final: bool = False  # this round asked for the now alone (its rounds ran out of room)
    no_room: bool = False  # not sent: not even the now fits; the turn ends with its files
    refused: TooLong | None = None  # the API refused it as too long (its count, Keel's estimate)
    # What the round's request cost, as the API counted it: the session's budget is
    # charged with it (a retry reports the stored round's again; the workflow saw neither).
    spent: Spend = Field(default_factory=Spend)


class CheckResult(BaseModel):
    problems: list[Problem] = Field(default_factory=list)


class StoreInput(BaseModel):
    attempt_id: str
    record_seq: int
    rounds_exhausted: bool = False
    abort_reason: str | None = None


class MoveInput(WindowRef):
    record_seq: int


class StoreResult(BaseModel):
    stored: bool
    reason: str = ""
    checkpoint_id: str | None = None
    cut_seq: int = 0
    fallbacks: list[str] = Field(default_factory=list)
    mind_text: str = ""
    memo_text: str = ""
    now_text: str = ""
    window_tokens_after: int = 0
    tokens_saved: int = 0  # the next request's size before less after, as call_model measures
    tokens_moved_out: int = 0


class PreviousCheckpoint(BaseModel):
    mind_text: str
    memo: list[dict[str, Any]]
    memo_dropped_seqs: list[int]
    now_text: str
    skills: list[dict[str, Any]]
    files_modified: list[str]
    files_read: list[str]
    carried_seqs: list[int]


def checkpoint_id_for(attempt_id: str) -> str:
    return f"ckpt:{attempt_id}"
