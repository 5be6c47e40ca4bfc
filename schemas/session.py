"""The session's durable contracts: workflow input, carried state, handler inputs, queries.

These models are stored in Temporal histories forever: add fields only as optional with
defaults, never rename or remove one.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field, field_validator
from temporalio.contrib.workflow_streams import WorkflowStreamState

from schemas.agent import AgentSpec, ApprovalDecision, PendingApproval
from schemas.budget import BudgetLimits, BudgetRequest, BudgetState, Spend
from schemas.cache_ttl import CacheTtl, cache_ttl, remember_gap, remember_written
from schemas.initiative import ChildRun, DelegatedTask, Wakeup
from schemas.interrupt import InterruptPolicy
from schemas.mcp import McpTool
from schemas.messages import (
    HARNESS_PREFIX,
    HarnessKind,
    ModelReply,
    looks_like_source_line,
)
from schemas.text import has_controls
from schemas.vault.scope import DEFAULT_SCOPE, check_scope

if TYPE_CHECKING:  # the checkpoint rules load the tokenizer; a client needs neither
    from schemas.checkpoint.policy import ModelWindow

# The session workflow's type and handler names: the durable API other clients (any SDK,
# plain Temporal JSON) call. `keel.client` calls them by these names, so it imports no
# workflow or activity code.
SESSION_WORKFLOW = "SessionWorkflow"


class Handler(StrEnum):
    # A plain turn is one update: ASK records the user's message and returns the turn's
    # outcome. SEND_MESSAGE + AWAIT_REPLY do the same in two steps (a caller that wants the
    # seq before the reply, or waits again after a cut-off).
    ASK = "ask"
    SEND_MESSAGE = "send_message"
    AWAIT_REPLY = "await_reply"
    WATCH = "watch"
    TASK = "task"
    AGENT_RUN = "agent_run"
    CALLBACK = "callback"
    STATUS = "status"
    MIND = "mind"
    MEMO = "memo"
    NOW = "now"
    # The agent spec, approvals, a session's end, a checkpoint on request.
    AGENT = "agent"  # query: the AgentSpec (or None)
    SET_AGENT = "set_agent"  # update: a new AgentSpec for later turns
    REFRESH_MCP = "refresh_mcp"  # update: list the MCP servers' tools again
    PENDING_APPROVALS = "pending_approvals"  # query
    DECIDE = "decide_approval"  # update: ApprovalDecision
    END = "end_session"  # update: EndSession
    CHECKPOINT_NOW = "checkpoint_now"  # update: a checkpoint through the usual chain
    # A client's file calls on the session's workspace (schemas.files).
    PUT_FILE = "put_file"  # update: PutFile -> FileVersion
    READ_FILE = "read_file"  # update: ReadFile -> FileData | None
    LIST_FILES = "list_files"  # update: ListFiles -> list[FileEntry]
    # A reply's text past what the outcome carried (TurnOutcome.reply_cut), in parts.
    READ_REPLY = "read_reply"  # update: ReadReply -> ReplyPart
    # Branching (schemas.branch): the state a fork or an export starts from, a rewind.
    STATE = "session_state"  # query: SessionState
    REWIND = "rewind"  # update: RewindRequest -> RewindDone
    # Budgets and interrupting (schemas.budget, schemas.interrupt).
    ANSWER_BUDGET = "answer_budget"  # update: BudgetAnswer -> SessionStatus
    INTERRUPT = "interrupt"  # update: stop the running turn's model call (no message)
    # The agent's own initiative (schemas.initiative, workflows.wakeups / delegation).
    WAKEUP = "wakeup"  # signal: WakeupSignal, from a recurring wakeup's schedule
    WAKEUPS = "wakeups"  # query: list[Wakeup]
    CANCEL_WAKEUP = "cancel_wakeup"  # update: CancelWakeup -> list[Wakeup]
    PARENT_ENDED = "parent_ended"  # signal: a child's parent ended (EndSession)
    STREAM_WATCHERS = "stream_watchers"  # query: StreamWatchers (activities.events)
    # signal: AgentRunInput, a child's answer told by its final model call
    CHILD_ANSWER = "child_answer"
    # The vault worker gave up on a transcript the session's model call queued
    # (activities.vault.outbox).
    TRANSCRIPT_FAILED = "transcript_failed"  # signal: TranscriptFailed


class Rejection(StrEnum):
    """The `ApplicationError.type` of each refusal a session's handlers raise. Callers
    branch on these, never on message text; `keel.client` maps each to an exception."""

    MESSAGE_REJECTED = "MessageRejected"  # empty, too long: nothing was recorded
    SESSION_STOPPED = "SessionStopped"  # the session takes no more input
    RECORD_FAILED = "RecordFailed"  # the record could not take it in time: nothing kept
    NO_SUCH_INPUT = "NoSuchInput"  # await_reply for a seq the session never gave out
    MEMORY_SCOPE_FIXED = "MemoryScopeFixed"  # a run asked for another memory scope
    NOT_PENDING = "NotPending"  # an approval decision for a call not (or no longer) pending
    AGENT_SPEC_REFUSED = "AgentSpecRefused"  # set_agent with a spec Keel refuses
    FILE_REFUSED = "FileRefused"  # a file call's path or size the workspace refuses
    # A read of a file past one payload: read it in parts (schemas.uploads; a FileRefused
    # to a caller that does not know this type).
    FILE_TOO_LARGE = "FileTooLarge"
    # An input that does not decode or validate (a wrong type, a missing field, a bad
    # scope): an Update refused, a start failed with the reason (workflows.entry).
    MALFORMED_INPUT = "MalformedInput"
    # A mind / memo / now query in the moment after continue-as-new, before the run has read
    # the checkpoint's texts back (workflows.carry): ask again.
    TEXTS_LOADING = "TextsLoading"
    BUSY = "SessionBusy"  # a message with policy 'reject' while a turn runs: not recorded
    NO_BUDGET_REQUEST = "NoBudgetRequest"  # a budget answer with no (such) request pending
    # A message's attached file missing, of no kind the model takes, or past its limits.
    ATTACHMENT_REFUSED = "AttachmentRefused"


# A run started with more than one argument gets one payload of this encoding instead,
# holding their count (workers.entry_guard), which its input refuses (workflows.entry).
ARGUMENTS_ENCODING = b"keel/arguments"

# Bounds on what an input may carry besides its text: an input id is an indexed column, a
# note or a reason becomes a line of the record.
MAX_INPUT_ID_CHARS = 256
MAX_NOTE_CHARS = 4_000
# A session's id is its workflow id (Temporal's default limit on one: 1,000 bytes), names
# its workspace folder (one path part; activities.workspace shortens a long one) and stands
# in the vault's entry markers (`<!-- keel:<id>:<seq> -->`).
MAX_SESSION_ID_BYTES = 1_000


def visibility_quoted(value: str) -> str:
    """`value` inside a Temporal visibility query's single quotes: a session id may hold a
    quote (`it's-42`), which would otherwise end the string ("malformed SQL query")."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


def id_clause(field: str, value: str, *, starts_with: bool = False) -> str:
    """A visibility query clause finding every record whose `field` (WorkflowId, ScheduleId)
    is `value`, or starts with it: what it lists may hold more, so the caller keeps the exact
    ones. Temporal's SQLite visibility (the dev server's) finds no string holding a double
    quote, escaped or not (`WorkflowId = 'say"hi'` and `STARTS_WITH 'say"'` listed nothing,
    `STARTS_WITH 'say'` listed it), so such a value is asked for by its part before the
    first double quote."""
    cut = value.split('"', 1)[0]
    op = "STARTS_WITH" if starts_with or cut != value else "="
    return f"{field} {op} '{visibility_quoted(cut)}'"


def session_id_problem(session_id: str) -> str | None:
    """Why `session_id` cannot name a session, or None. Refused: what cannot be a folder's
    name (empty, `.`, `..`, a slash or backslash), what Temporal would refuse as a
    workflow id (too long), control characters and lone surrogates (they break a log
    line, a terminal, UTF-8), a leading `_` (Keel's own workspaces, `_shared` among them:
    a session so named wrote where every session reads) and `-->` (it would end a vault
    marker)."""
    if not session_id:
        return "a session id may not be empty"
    size = len(session_id.encode("utf-8", "surrogatepass"))
    if size > MAX_SESSION_ID_BYTES:
        return (f"the session id has {size} bytes in UTF-8; the limit is "
                f"{MAX_SESSION_ID_BYTES}")
    if session_id in (".", ".."):
        return f"{session_id!r} cannot be a session id"
    for bad, what in (("/", "a slash"), ("\\", "a backslash"), ("-->", "'-->'")):
        if bad in session_id:
            return f"a session id may not hold {what}"
    if has_controls(session_id):
        return "a session id may not hold control characters or lone surrogates"
    if session_id.startswith("_"):
        return "a session id may not start with '_' (Keel's own workspaces do)"
    return None


def text_limits(**fields: tuple[str, int]) -> str | None:
    """The first of `fields` (name: (value, limit)) over its limit, said, or None."""
    for name, (value, limit) in fields.items():
        if len(value) > limit:
            return f"{name} has {len(value)} characters; the limit is {limit}"
    return None


# Why a session stops when nothing more can be moved out of its context (workflows.turn):
# a condition of its conversation, which a copy of it (an import) keeps.
TOO_LONG_MESSAGE = (
    "This conversation has grown too long to continue reliably. "
    "Start a new session with /new, or fork this one from an earlier point (keel fork)."
)


class SessionConfig(BaseModel):
    """What a session needs to decide things; fixed at start, carried across runs."""

    model: str = "claude-sonnet-5"
    context_window: int = 200_000
    max_output_tokens: int = 8_192
    price_step_tokens: int | None = None
    max_message_chars: int = 200_000
    user_name: str = "user"
    max_tool_rounds_per_turn: int = 50
    # How long a user's message may wait for the record (a database that went away)
    # before the caller is told it was not recorded.
    record_timeout_s: int = 60
    # Test hook: continue-as-new once history passes this many events (0: only when
    # Temporal suggests it).
    continue_as_new_after_events: int = 0
    # Whose long memory this session reads and writes (a person, a team, a tenant: the
    # starting service's id; schemas.vault.scope). None: no long memory at all. Fixed for
    # the session's life: a run carrying state with another scope is refused.
    memory_scope: str | None = DEFAULT_SCOPE
    # How long the prompt cache keeps the session's context (schemas.cache_ttl): `auto`
    # asks for an hour when its model calls wait on one another past five minutes.
    prompt_cache_ttl: CacheTtl = CacheTtl.AUTO

    @field_validator("memory_scope")
    @classmethod
    def _valid_scope(cls, value: str | None) -> str | None:
        return None if value is None else check_scope(value)

    # The agent a service gave the session (instructions, tools, MCP, approvals).
    agent: AgentSpec | None = None
    # A child session: its parent and the task it was given (workflows.delegation).
    delegated: DelegatedTask | None = None

    def with_agent(self, spec: AgentSpec | None) -> SessionConfig:
        """This config with `spec` applied: its model and limits win where it sets them."""
        if spec is None:
            return self.model_copy(update={"agent": None})
        update: dict[str, object] = {"agent": spec}
        if spec.model:
            update["model"] = spec.model
        if spec.context_window:
            update["context_window"] = spec.context_window
        if spec.max_output_tokens:
            update["max_output_tokens"] = spec.max_output_tokens
        if spec.prompt_cache_ttl:
            update["prompt_cache_ttl"] = spec.prompt_cache_ttl
        return self.model_copy(update=update)

    def window(self) -> ModelWindow:
        from schemas.checkpoint.policy import ModelWindow

        return ModelWindow(context_window=self.context_window,
                           max_output_tokens=self.max_output_tokens,
                           price_step_tokens=self.price_step_tokens)


# What a session's config may hold at start (`config_bounds_problem`): each a bound past
# which the session could not work (a reply of no tokens, a record that never answers in
# time, a user's name that reads as a source line), not a preference.
_INT_BOUNDS: dict[str, tuple[int, int]] = {
    "context_window": (1_024, 100_000_000),
    "max_output_tokens": (1, 10_000_000),
    "max_message_chars": (1, 100_000_000),
    "max_tool_rounds_per_turn": (1, 10_000),
    "record_timeout_s": (1, 86_400),
    "continue_as_new_after_events": (0, 1_000_000_000),
}
MAX_MODEL_CHARS, MAX_USER_NAME_CHARS = 256, 64


def config_bounds_problem(config: SessionConfig) -> str | None:
    """Why a session cannot start with `config`, by its values alone, or None (its window
    against what it carries: schemas.input_size.config_fit_problem). Checked at start
    only: a session carried over keeps what it started with."""
    for name, (low, high) in _INT_BOUNDS.items():
        value = getattr(config, name)
        if not low <= value <= high:
            return f"config.{name} is {value}; it may be from {low:,} to {high:,}"
    if config.price_step_tokens is not None and config.price_step_tokens < 1:
        return f"config.price_step_tokens is {config.price_step_tokens}; it may be 1 or more"
    for name, value, most in (("model", config.model, MAX_MODEL_CHARS),
                              ("user_name", config.user_name, MAX_USER_NAME_CHARS)):
        if not value.strip() or len(value) > most:
            return f"config.{name} has {len(value)} characters; it may have 1 to {most}"
        if has_controls(value):
            return f"config.{name} may not hold control characters or lone surrogates"
    if looks_like_source_line(config.user_name) or HARNESS_PREFIX in config.user_name:
        return "config.user_name reads as a source line; a user's name may not"
    fallback = config.agent.fallback_model if config.agent else None
    if fallback is not None and (not fallback.strip() or has_controls(fallback)):
        return "agent.fallback_model may not be blank or hold control characters"
    return None


class PendingInput(BaseModel):
    """An input recorded but not yet answered by a turn."""

    seq: int
    kind: str  # "user" or a HarnessKind value
    query: str = ""  # the input's opening words, for this turn's long-memory recall


class TurnOutcome(BaseModel):
    """How a turn ended, for callers waiting on a reply to their input."""

    turn: int
    input_seqs: list[int] = Field(default_factory=list)
    reply_seq: int | None = None
    reply_text: str = ""
    # The reply's text goes on past `reply_text` (its first REPLY_INLINE_CHARS): the record
    # holds it whole, and `Handler.READ_REPLY` reads it (keel.client does, so its callers
    # get the whole text). `reply_chars` is the whole text's length.
    reply_cut: bool = False
    reply_chars: int = 0
    error: str | None = None
    stopped_reason: str | None = None
    # The session is continuing as new: ask again (the client helper does) and the new run
    # answers.
    retry: bool = False
    interrupted: bool = False  # a new message stopped this turn (schemas.interrupt)
    spent: Spend | None = None  # what the turn spent (schemas.budget)
    # The API's stop reason for the last reply: "max_tokens" is a reply cut at the output
    # limit (schemas.messages.stop_note says what to tell a person).
    stop_reason: str | None = None


class TurnInProgress(BaseModel):
    """A turn carried over continue-as-new while one of its tool calls waited on a person:
    the new run runs `reply`'s calls from `next_call` on (the waiting one first, its
    approval still pending in `SessionState.approvals`), then goes on with the turn."""

    reply: ModelReply
    next_call: int
    answered: list[int] = Field(default_factory=list)  # the inputs this turn answers
    transcribe: list[int] = Field(default_factory=list)
    rounds: int = 0
    first_seq: int = 0
    memory_block: str = ""
    # Decisions taken in the old run for calls of `reply` not yet run.
    decisions: list[ApprovalDecision] = Field(default_factory=list)


class SessionState(BaseModel):
    """The small state carried over continue-as-new. Data lives in PostgreSQL."""

    session_id: str
    config: SessionConfig = Field(default_factory=SessionConfig)
    next_seq: int = 1
    recorded_seqs: list[int] = Field(default_factory=list)  # recorded beyond `recorded_upto`
    recorded_upto: int = 0  # every seq <= this is recorded (or abandoned)
    pending: list[PendingInput] = Field(default_factory=list)
    turn: int = 0
    window_start_seq: int = 1
    checkpoint_id: str | None = None
    checkpoint_count: int = 0
    context_tokens: int = 0
    last_usage_tokens: int = 0
    stopped_reason: str | None = None
    run_count: int = 1
    checkpoint_attempts: int = 0
    mind_text: str = ""
    memo_text: str = ""
    now_text: str = ""
    # The three texts above were left in PostgreSQL at continue-as-new (workflows.carry):
    # the run reads them by `checkpoint_id` before its first turn.
    texts_in_store: bool = False
    usage_ratio: float = 1.0
    recent_savings: list[int] = Field(default_factory=list)
    # The last turns' outcomes, so a caller waiting across continue-as-new still gets its
    # reply.
    recent_outcomes: list[TurnOutcome] = Field(default_factory=list)
    # MCP tools, listed once per session (refreshed by an Update), never per model call.
    mcp_tools: list[McpTool] = Field(default_factory=list)
    mcp_listed: bool = False
    mcp_problems: list[str] = Field(default_factory=list)
    # Calls waiting on a person, and the ids of the last calls decided (bounded).
    approvals: list[PendingApproval] = Field(default_factory=list)
    decided_calls: list[str] = Field(default_factory=list)
    ended: bool = False  # ended on request (`end_session`)
    checkpoint_requested: bool = False
    # A turn that continued as new while a call waited on a person (resumed first).
    turn_in_progress: TurnInProgress | None = None
    budget: BudgetState = Field(default_factory=BudgetState)  # spend, raises, a pause
    # The agent's own initiative: its wakeups, the children it delegated to, and whether a
    # child's task was recorded and answered (workflows.wakeups, workflows.delegation).
    wakeups: list[Wakeup] = Field(default_factory=list)
    wakeups_made: int = 0
    children: list[ChildRun] = Field(default_factory=list)
    delegated_seq: int | None = None
    # When the last model call was asked (workflow time), the waits between calls so far
    # (seconds) and what the calls billed as input (tokens), the last few of each: how long
    # the prompt cache should keep the context (schemas.cache_ttl).
    last_call_at: datetime | None = None
    call_gaps_s: list[float] = Field(default_factory=list)
    call_written: list[int] = Field(default_factory=list)
    cache_ttl_refused: bool = False  # the API (a provider's) took no hour: asked no more
    # The model that answered the last call, as the reply named it (the offline model
    # answers a session configured for another when the worker has no API key).
    answered_by: str | None = None

    def take_agent(self, spec: AgentSpec) -> None:
        """`spec` is the session's agent from now on (its model and limits where it sets
        them); the MCP tools are listed again when its servers are not the ones listed."""
        before = self.config.agent
        self.config = self.config.with_agent(spec)
        if before is None or before.mcp_servers != spec.mcp_servers:
            self.mcp_listed = False

    # ----- model calls: how long the prompt cache should keep the context ----------------

    def call_asked(self, now: datetime) -> CacheTtl:
        """A model call asked at `now` (workflow time): the wait since the session's last
        call remembered (between turns, for a person's approval, a child, a long tool), and
        the call's cache lifetime (schemas.cache_ttl)."""
        if self.last_call_at is not None:
            self.call_gaps_s = remember_gap(self.call_gaps_s,
                                            (now - self.last_call_at).total_seconds())
        self.last_call_at = now
        return self.cache_ttl_now()

    def cache_ttl_now(self) -> CacheTtl:
        """The lifetime a call asked now would get (the wait before it aside)."""
        if self.cache_ttl_refused:
            return CacheTtl.SHORT
        return cache_ttl(self.config.prompt_cache_ttl, self.call_gaps_s, self.context_tokens,
                         self.call_written)

    def call_billed(self, tokens: int) -> None:
        """What the last call billed as input (uncached and cache writes), remembered."""
        self.call_written = remember_written(
            self.call_written, tokens, self.call_gaps_s[-1] if self.call_gaps_s else None)

    # ----- sequence numbers: every input, reply, result and notice gets the next one -----

    def allocate_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def settle_seq(self, seq: int) -> None:
        """Mark a seq recorded (or abandoned): the window may read up to the settled prefix."""
        if seq <= self.recorded_upto:
            return
        pending = set(self.recorded_seqs)
        pending.add(seq)
        while self.recorded_upto + 1 in pending:
            self.recorded_upto += 1
            pending.discard(self.recorded_upto)
        self.recorded_seqs = sorted(pending)


class SessionInput(BaseModel):
    """Workflow input: a fresh session (`state` None) or one carried over continue-as-new."""

    session_id: str
    config: SessionConfig = Field(default_factory=SessionConfig)
    state: SessionState | None = None
    # The event stream's retained log and offsets, carried over continue-as-new
    # (workflows.events); typed so, never Any, or the converter hands back a dict.
    events: WorkflowStreamState | None = None


class UserMessage(BaseModel):
    text: str
    # Files of the session's workspace sent with the words (schemas.attachments): the
    # record keeps their bytes; the message carries their paths only.
    attachments: list[str] = Field(default_factory=list)
    input_id: str | None = None  # the caller's idempotency key; Keel makes one if absent
    # While a turn runs: wait for it, stop it, or be refused (None: the spec's, or enqueue).
    on_busy: InterruptPolicy | None = None


class WatchInput(BaseModel):
    watch_id: str
    name: str
    text: str
    input_id: str | None = None
    # Files of the session's workspace sent with it (schemas.attachments), by path.
    attachments: list[str] = Field(default_factory=list)


class TaskInput(BaseModel):
    task_id: str
    name: str
    text: str
    input_id: str | None = None
    # Files of the session's workspace sent with it (schemas.attachments), by path.
    attachments: list[str] = Field(default_factory=list)


class AgentRunInput(BaseModel):
    run_id: str
    from_session: str
    text: str
    input_id: str | None = None
    # Files of the session's workspace sent with it (schemas.attachments), by path.
    attachments: list[str] = Field(default_factory=list)
    outcome: str | None = None  # a child's answer: "answered" or "failed" (delegation)
    spent: Spend | None = None  # a child's answer: what the child spent, for its parent


class CallbackInput(BaseModel):
    run_id: str
    from_session: str
    text: str
    input_id: str | None = None
    # Files of the session's workspace sent with it (schemas.attachments), by path.
    attachments: list[str] = Field(default_factory=list)


class MessageAccepted(BaseModel):
    session_id: str
    seq: int
    input_id: str


class SessionPhase(StrEnum):
    IDLE = "idle"
    RUNNING = "running"
    CHECKPOINTING = "checkpointing"
    STOPPED = "stopped"
    AWAITING_APPROVAL = "awaiting_approval"
    AWAITING_BUDGET = "awaiting_budget"
    AWAITING_CHILD = "awaiting_child"  # a delegate call waits for its child's answer
    ENDED = "ended"


class SessionStatus(BaseModel):
    session_id: str
    phase: SessionPhase
    turn: int
    context_tokens: int
    context_window: int
    checkpoint_threshold: int
    checkpoint_count: int
    pending_inputs: int
    window_start_seq: int
    last_seq: int
    model: str
    stopped_reason: str | None = None
    last_error: str | None = None
    pending_approvals: list[PendingApproval] = Field(default_factory=list)
    ended: bool = False
    agent_instructions_chars: int = 0
    tools: list[str] = Field(default_factory=list)
    spent: Spend = Field(default_factory=Spend)  # the session's, so far
    turn_spent: Spend = Field(default_factory=Spend)  # the current (or last) turn's
    budget_request: BudgetRequest | None = None  # a reached budget waiting on a person
    # The limits in force (the spec's, with what was raised; a turn's: this turn's).
    session_limits: BudgetLimits | None = None
    turn_limits: BudgetLimits | None = None
    wakeups: list[Wakeup] = Field(default_factory=list)
    children: list[ChildRun] = Field(default_factory=list)
    parent_session: str | None = None
    # A child's run's result only: its answer, when its parent hears it so
    # (`DelegatedTask.answer_in_result`).
    answer: AgentRunInput | None = None
    # The prompt cache's lifetime a call asked now would get, and the session's setting.
    prompt_cache_ttl: CacheTtl = CacheTtl.SHORT
    prompt_cache_setting: CacheTtl = CacheTtl.AUTO
    answered_by: str | None = None  # the model that answered the last call


class CancelWakeup(BaseModel):
    wakeup_id: str


class TranscriptFailed(BaseModel):
    """What the vault worker tells a session whose queued transcript it could not write."""

    message: str


class EndSession(BaseModel):
    reason: str = "ended on request"


class SessionSummary(BaseModel):
    """One line of `keel list`, read from Temporal visibility (the workflow's memo)."""

    session_id: str
    phase: str
    turn: int = 0
    context_percent: float = 0.0
    checkpoints: int = 0
    last_activity: str = ""
    status: str = ""  # Temporal's: running, completed, canceled, terminated, ...
    parent: str | None = None  # a child session's parent (delegation)


HARNESS_KINDS: tuple[HarnessKind, ...] = tuple(HarnessKind)


class AwaitReply(BaseModel):
    seq: int  # the input whose answering turn to wait for


class ReadReply(BaseModel):
    seq: int = Field(ge=1)  # the reply's seq (TurnOutcome.reply_seq)
    start: int = Field(default=0, ge=0)  # the first character to read


class ReplyPart(BaseModel):
    """At most REPLY_INLINE_CHARS of a reply's text from `start`, and the whole length."""

    text: str
    start: int
    total_chars: int
