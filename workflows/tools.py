"""Running the model's tool calls inside the session workflow: built-ins through
`SessionActivities.run_tool`, a service's tools as activities on the service's own task
queue, MCP tools through `McpActivities`, and the approval pause in front of any of them.

Invariants:
- Deterministic: every effect is an activity, every wait a `workflow.wait_condition`, time
  is `workflow.now()`. The rules (routing, policy, schema checks) are pure, in
  `schemas.agent`.
- A service or MCP result over its cap keeps its whole text in the session's workspace
  (`activities.files.kept_result_path`, written once per call id), and the cut result in
  the record says where. An MCP result is kept by the worker that got it (its activity
  returns only the cut text and the path, `McpCallResult.whole_result`), so no payload
  carries it whole. A service result too large for a payload comes as a small pointer
  (`schemas.agent.result_ref`, workers.payload_refs): the workflow never holds it; the
  record activity reads it, keeps it whole and records it cut.
- Every call ends with exactly one tool result in the record (idempotent by call id):
  the tool's own, or an error result saying what went wrong (unknown tool, input that does
  not fit the schema naming the field, denied, a service that raised, timed out or is down,
  an MCP server that crashed or hangs). A tool failure never fails the session.
- A pending approval lives in workflow state (`SessionState.approvals`), so it survives a
  worker restart; a wait that outlasts the run's history continues as new with the turn
  (`SessionState.turn_in_progress`), and the new run runs the waiting call first. A
  decision is bound to the call id and the digest of its input.
- The runner never checkpoints or continues as new itself: what a wait needs of the turn
  is returned as a `WaitDecision` (a checkpoint while it waits, continue-as-new with the
  turn), and the turn acts on it (workflows.turn); after a checkpoint, `resume` goes on
  with the wait exactly where it stood.
- MCP tools are listed once per session (or on the refresh Update) and kept in state; they
  are never listed before a model call.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    TimeoutType,
)
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from activities.files import FileActivities, KeepResultInput
    from activities.mcp import CallMcpToolInput, ListMcpToolsInput, McpActivities
    from activities.session import (
        RecordInput,
        SessionActivities,
        ToolInput,
        ToolResultInput,
    )
    from schemas.agent import (
        APPROVAL_SOURCE_LINE,
        BUILTIN_TOOL_NAMES,
        DEFAULT_OUTPUT_CAP_CHARS,
        ApprovalDecision,
        ApprovalPolicy,
        ApprovalRules,
        PendingApproval,
        ServiceToolCall,
        ToolKind,
        ToolRoute,
        approval_decided_notice,
        approval_for,
        approval_wait_notice,
        cut_result,
        denied_text,
        input_digest,
        input_problem,
        result_files,
        result_ref,
        result_text,
        route,
    )
    from schemas.branch import REWIND_DECIDER
    from schemas.events import (
        SHORT_INPUT_CHARS,
        ApprovalDecided,
        ApprovalNeeded,
        ToolCalled,
        ToolResult,
        cut,
    )
    from schemas.initiative import INITIATIVE_TOOL_NAMES
    from schemas.input_size import fit_mcp_tools
    from schemas.interrupt import NOT_RUN_TEXT
    from schemas.messages import MessageType, ModelReply, ToolCall
    from schemas.session import SessionPhase
    from schemas.text import TEMPORAL_BLOB_LIMIT_BYTES, make_storable
    from workflows.delegation import ROUND_TRIP_PATCH
    from workflows.options import (
        FILE_CALL,
        RECORD_NOTICE,
        RECORD_TOOL_RESULT,
        mcp_options,
        service_tool_options,
        tool_call,
    )
    from workflows.run import SessionRun

__all__ = ["BUILTIN_NAMES", "CheckpointWhileWaiting", "ContinueAsNewWaiting", "ToolRunner",
           "WaitDecision"]

# MCP tools whose definitions would take more than the agent's share of the window are left
# out (schemas.input_size), said in the listing's notice: from this patch on.
MCP_FIT_PATCH = "mcp-tools-fit-the-window"
# A service tool's files (schemas.agent.ToolFile) reach its result's row: from this patch on.
SERVICE_FILES_PATCH = "service-tool-files"


@dataclass(frozen=True)
class CheckpointWhileWaiting:
    """A checkpoint was asked for while a call waits on a person: the turn takes it over
    what came before `before_seq` (the waiting call's assistant message), and the wait
    goes on."""

    before_seq: int


@dataclass(frozen=True)
class ContinueAsNewWaiting:
    """The run's history grew long while a call waits on a person: the turn goes over
    continue-as-new, and the new run resumes it at call `next_call` of `reply`."""

    reply: ModelReply
    next_call: int


# What an approval wait asks of the turn; a call that needs nothing just runs.
WaitDecision = CheckpointWhileWaiting | ContinueAsNewWaiting


@dataclass
class _Waiting:
    """A call waiting on a person, where `ToolRunner.resume` finds it."""

    call: ToolCall
    pending: PendingApproval
    rules: ApprovalRules | None  # as they were when the wait began
    before_seq: int  # the waiting call's assistant message
    where: ToolRoute

# Built-in names only: their schemas are checked where they run (activities/tools.py).
BUILTIN_NAMES = BUILTIN_TOOL_NAMES
# The agent's own initiative (wakeups, delegate): run in the workflow, by the handlers the
# session gives the runner (workflows.wakeups, workflows.delegation).
InitiativeTool = Callable[[ToolCall], Awaitable[tuple[str, bool]]]
BUILTINS: list[dict[str, Any]] = [{"name": n, "input_schema": None} for n in BUILTIN_NAMES]
KEPT_DECISIONS = 200


def _preview(value: Any) -> str:
    return cut(json.dumps(value, ensure_ascii=False, default=str), SHORT_INPUT_CHARS)


def _cause(err: ActivityError) -> str:
    cause = err.cause
    if isinstance(cause, ActivityTimeout):
        if cause.type in (TimeoutType.SCHEDULE_TO_CLOSE, TimeoutType.SCHEDULE_TO_START):
            return "no worker of the service answered in time (is it running?)"
        if cause.type == TimeoutType.START_TO_CLOSE:
            return "the call timed out"
        return f"the call timed out ({cause.type.name.lower() if cause.type else 'timeout'})"
    if isinstance(cause, ApplicationError) and cause.type == "PayloadsTooLarge":
        return ("its result is over Temporal's payload limit "
                f"({TEMPORAL_BLOB_LIMIT_BYTES} bytes), so it could not be sent; a service "
                "worker sends a result of any size by reference with Keel's result storage "
                "(workers.payload_refs.service_converter)")
    if isinstance(cause, ApplicationError):
        return f"the tool raised {cause.type or 'an error'}: {cause.message}"
    return str(cause or err)


class ToolRunner:
    """The tool side of one session run; holds no state of its own but decisions taken
    in this run (the durable part is `SessionState`). It records through the run and
    fences a failed call's seq with `fence`; what a wait needs of the turn (a checkpoint,
    continue-as-new) it returns to the turn, which acts on it."""

    def __init__(self, run: SessionRun,
                 fence: Callable[[int, str], Awaitable[None]]) -> None:
        self.run = run
        self.fence = fence
        carried = run.state.turn_in_progress
        # Decisions the previous run took for calls it carried over, not yet run.
        self.decisions: dict[str, ApprovalDecision] = {
            d.call_id: d for d in (carried.decisions if carried else [])}
        self.running: tuple[ModelReply, int] | None = None  # the reply and call index now
        # The turn was asked to stop (workflows.interrupt): calls not started are not run.
        self.stopping: Callable[[], bool] = lambda: False
        self._waiting: _Waiting | None = None  # the call whose wait a checkpoint paused
        self.initiative: dict[str, InitiativeTool] = {}  # name -> its handler
        # Queues a row for the turn's next model call to record (workflows.inbox `fold_row`).
        self.fold_row: Callable[[RecordInput], None] | None = None
        # The first seq of the live window, as the turn sees it (workflows.turn).
        self.live_from_seq: Callable[[], int | None] = lambda: None

    # ----- MCP tool lists ---------------------------------------------------------------

    async def ensure_mcp(self, *, refresh: bool = False) -> None:
        state = self.run.state
        spec = state.config.agent
        if spec is None or not spec.mcp_servers or (state.mcp_listed and not refresh):
            return
        tools, problems = [], []
        for server in spec.mcp_servers:
            try:
                listed = await workflow.execute_activity_method(
                    McpActivities.list_mcp_tools,
                    ListMcpToolsInput(server=server, session_id=state.session_id,
                                      refresh=refresh),
                    **mcp_options(server.activity_timeout_s("list"), listing=True))
            except ActivityError as err:
                problems.append(f"MCP server {server.name!r} is unavailable: "
                                f"{getattr(err.cause, 'message', None) or err.cause or err}")
                continue
            tools.extend(listed.tools)
            problems.extend(listed.problems)
        kept, left = fit_mcp_tools(spec, tools, self.run.window.hard_limit)
        if left and workflow.patched(MCP_FIT_PATCH):  # else every request would be refused
            tools = kept
            problems.append(f"{len(left)} MCP tools left out ({', '.join(left[:10])}"
                            f"{', …' if len(left) > 10 else ''}): their definitions would "
                            "take more of the window than the conversation may give them")
        state.mcp_tools, state.mcp_problems, state.mcp_listed = tools, problems, True
        if problems:
            await self.run.record_notice("MCP: " + "; ".join(problems))

    # ----- approvals --------------------------------------------------------------------

    def decide(self, decision: ApprovalDecision) -> PendingApproval:
        state = self.run.state
        pending = next(p for p in state.approvals if p.call_id == decision.call_id)
        self.decisions[decision.call_id] = decision
        state.approvals = [p for p in state.approvals if p.call_id != decision.call_id]
        state.decided_calls = [*state.decided_calls, decision.call_id][-KEPT_DECISIONS:]
        return pending

    def calling_seq(self) -> int | None:
        """The assistant row of the call running now (a wakeup it schedules keeps it)."""
        return self.running[0].seq if self.running is not None else None

    def waiting_reply_seq(self) -> int | None:
        """The assistant row whose call waits on a person now (None: no call waits)."""
        return self._waiting.before_seq if self._waiting is not None else None

    async def _ask(self, call: ToolCall, rules: ApprovalRules | None) -> PendingApproval:
        """`call` waits on a person from now (a carried-over pending call keeps its own
        `since`); the record and the stream say so once."""
        state = self.run.state
        timeout = rules.timeout_s if rules else None
        pending = next((p for p in state.approvals if p.call_id == call.id), None)
        if pending is None:
            pending = PendingApproval(
                call_id=call.id, tool=call.name, input=call.input,
                input_digest=input_digest(call.input), since=workflow.now(),
                turn=state.turn, timeout_s=timeout)
        if pending not in state.approvals and call.id not in self.decisions:
            state.approvals.append(pending)
            self.run.phase = SessionPhase.AWAITING_APPROVAL
            await self._harness(approval_wait_notice(pending), f"approval-wait-{call.id}")
            self.run.events.emit(ApprovalNeeded, turn=state.turn, approval_id=call.id,
                                 tool=call.name, summary=_preview(call.input))
        self.run.phase = SessionPhase.AWAITING_APPROVAL
        self.run.publish_summary()
        return pending

    async def _wait(self, w: _Waiting, *, after_checkpoint: bool) -> WaitDecision | None:
        """Wait durably for a person's decision on `w.call`. What the wait needs of the
        turn is returned: a checkpoint asked for meanwhile (it runs while the call waits,
        and its now sees the wait, from the record's notice; then the wait goes on, from
        `resume`), or continue-as-new with the turn when the run's history grew long. None:
        decided (or timed out, or the session ended). One decided in the run that carried
        this turn over waits no more."""
        state, call = self.run.state, w.call
        timeout = w.rules.timeout_s if w.rules else None
        if after_checkpoint and (moved := self._moving_on(call)):
            return moved
        while call.id not in self.decisions and not state.ended:
            left = None
            if timeout:
                left = timeout - (workflow.now() - w.pending.since).total_seconds()
            if left is not None and left <= 0:
                allow = w.rules is not None and w.rules.on_timeout == "allow"
                self.decide(ApprovalDecision(
                    call_id=call.id, approve=allow, by="timeout",
                    note=f"no decision within {timeout:g} s; the policy's default applies"))
                break
            try:
                await workflow.wait_condition(
                    lambda: call.id in self.decisions or state.ended or self.stopping()
                    or state.checkpoint_requested or self.run.should_continue_as_new(),
                    timeout=timedelta(seconds=left) if left is not None else None)
            except TimeoutError:  # the builtin: wait_condition's timeout ran out
                continue
            if self.stopping() and call.id not in self.decisions:  # workflows.interrupt
                self.decide(ApprovalDecision(call_id=call.id, approve=False, by="keel",
                                             note="the turn was interrupted"))
                break
            if state.checkpoint_requested and call.id not in self.decisions \
                    and not state.ended:
                return CheckpointWhileWaiting(w.before_seq)
            if moved := self._moving_on(call):
                return moved
        return None

    def _moving_on(self, call: ToolCall) -> ContinueAsNewWaiting | None:
        """A wait may outlast many events: the turn goes on in a new run, the pending call
        first (its approval is in state)."""
        state = self.run.state
        if self.run.should_continue_as_new() and call.id not in self.decisions \
                and not state.ended and self.running is not None:
            return ContinueAsNewWaiting(*self.running)
        return None

    async def _decided(self, call: ToolCall, pending: PendingApproval) -> ApprovalDecision:
        """The decision on `call` said (denied when the session was ended meanwhile)."""
        state = self.run.state
        if call.id not in self.decisions:  # the session was ended meanwhile
            self.decide(ApprovalDecision(call_id=call.id, approve=False, by="keel",
                                         note="the session was ended"))
        decision = self.decisions[call.id]
        self.run.events.emit(ApprovalDecided, turn=state.turn, approval_id=call.id,
                             approved=decision.approve, by=decision.by, note=decision.note)
        await self._harness(approval_decided_notice(pending, decision),
                            f"approval-decided-{call.id}")
        self.run.phase = SessionPhase.RUNNING
        self.run.publish_summary()
        return decision

    # ----- calls ------------------------------------------------------------------------

    async def run_calls(self, reply: ModelReply, start: int = 0) -> WaitDecision | None:
        """Run `reply`'s calls in order from index `start` (a carried-over turn resumes at
        the call that was waiting). Returns what an approval wait needs of the turn (after
        a checkpoint, `resume` goes on), or None when every call has its result."""
        for index in range(start, len(reply.tool_calls)):
            self.running = (reply, index)
            if self.stopping():
                await self._result(reply.tool_calls[index], NOT_RUN_TEXT, is_error=True,
                                   meta={"not_run": "interrupted"})
                continue
            wait = await self.run_call(reply, reply.tool_calls[index])
            if wait is not None:
                return wait
        self.running = None
        return None

    async def resume(self) -> WaitDecision | None:
        """Go on after the checkpoint a wait asked for: the wait, then the reply's other
        calls."""
        assert self.running is not None and self._waiting is not None
        reply, index = self.running
        wait = await self._after_wait(reply, self._waiting, after_checkpoint=True)
        if wait is not None:
            return wait
        return await self.run_calls(reply, index + 1)

    async def run_call(self, reply: ModelReply, call: ToolCall) -> WaitDecision | None:
        state = self.run.state
        spec = state.config.agent
        self.run.events.emit(ToolCalled, turn=state.turn, tool_use_id=call.id,
                             name=call.name, input=call.input_preview)
        where = route(call.name, BUILTINS, spec, state.mcp_tools)
        if where.kind is ToolKind.UNKNOWN:
            await self._result(call, f"There is no tool named {call.name!r} in this "
                               "session.", is_error=True)
            return None
        problem = input_problem(where.input_schema, call.input)
        if problem:
            await self._result(call, f"{call.name}: {problem}", is_error=True)
            return None
        policy = approval_for(spec, call.name)
        if policy is ApprovalPolicy.DENY:
            await self._result(call, denied_text(call.name, "", by_policy=True), is_error=True)
            return None
        if policy is ApprovalPolicy.ASK:
            rules = spec.approvals if spec else None  # as they were when the wait began
            pending = await self._ask(call, rules)
            waiting = _Waiting(call, pending, rules, reply.seq, where)
            return await self._after_wait(reply, waiting, after_checkpoint=False)
        await self._dispatch(reply, call, where)
        return None

    async def _after_wait(self, reply: ModelReply, w: _Waiting, *,
                          after_checkpoint: bool) -> WaitDecision | None:
        """The wait on `w.call`, then its decision said and, if approved, the call run."""
        self._waiting = w
        wait = await self._wait(w, after_checkpoint=after_checkpoint)
        if wait is not None:
            return wait
        self._waiting = None
        call = w.call
        decision = await self._decided(call, w.pending)
        if not decision.approve:
            # A rewind's cancel says only that (workflows.branch); a person's, who and why.
            text = decision.note if decision.by == REWIND_DECIDER else denied_text(
                call.name, decision.note)
            await self._result(call, text, is_error=True,
                               meta={"denied": True, "by": decision.by})
            return None
        await self._dispatch(reply, call, w.where)
        return None

    async def _dispatch(self, reply: ModelReply, call: ToolCall, where: ToolRoute) -> None:
        """The call where it runs: a built-in, a service's activity, or an MCP server."""
        state = self.run.state
        if where.kind is ToolKind.BUILTIN and call.name in INITIATIVE_TOOL_NAMES:
            text, is_error = await self.initiative[call.name](call)
            if not self._fold_result(reply, call, text, is_error):
                await self._result(call, text, is_error=is_error)
        elif where.kind is ToolKind.BUILTIN:
            await self._builtin(reply, call)
        elif where.kind is ToolKind.SERVICE:
            assert where.service is not None
            tool = where.service
            try:
                value = await workflow.execute_activity(
                    tool.activity, ServiceToolCall(session_id=state.session_id,
                                                   call_id=call.id, tool=tool.name,
                                                   input=call.input),
                    **service_tool_options(tool.task_queue, tool.timeout_s,
                                           tool.schedule_to_close_s, tool.max_attempts))
            except ActivityError as err:
                await self._result(call, f"{tool.name} failed: {_cause(err)}", is_error=True,
                                   cap=tool.output_cap_chars)
                return
            if (ref := result_ref(value)) is not None:  # kept by reference: read there
                await self._result(call, "", is_error=False, cap=tool.output_cap_chars,
                                   ref=ref)
                return
            text, is_error = result_text(value)
            files = result_files(value)  # the patch only where there are some: its marker
            if files and not workflow.patched(SERVICE_FILES_PATCH):
                files = []
            await self._result(call, text, is_error=is_error, cap=tool.output_cap_chars,
                               files=files)
        else:
            await self._mcp(call, where)

    async def _mcp(self, call: ToolCall, where: ToolRoute) -> None:
        assert where.mcp is not None and where.mcp_server is not None
        try:
            out = await workflow.execute_activity_method(
                McpActivities.call_mcp_tool,
                CallMcpToolInput(server=where.mcp_server, tool=where.mcp.original_name,
                                 arguments=call.input,
                                 session_id=self.run.state.session_id,
                                 call_id=call.id, cap_chars=DEFAULT_OUTPUT_CAP_CHARS),
                **mcp_options(where.mcp_server.activity_timeout_s("call")))
        except ActivityError as err:
            await self._result(call, f"{call.name} failed: {_cause(err)}", is_error=True)
            return
        text = out.text
        if out.structured_json and not text.strip():
            text = out.structured_json
        meta: dict[str, Any] = {"mcp_failure": out.failure.value if out.failure else None}
        if out.whole_result:  # the worker kept the whole text and cut it to the cap
            meta |= {"cut": True, "whole_result": out.whole_result}
        if out.images:  # kept in the workspace: the record sends them with the result
            meta["images"] = out.images
        await self._result(call, text, is_error=out.is_error, meta=meta,
                           cap=len(text) if out.whole_result else DEFAULT_OUTPUT_CAP_CHARS)

    async def _builtin(self, reply: ModelReply, call: ToolCall) -> None:
        state = self.run.state
        seq = state.allocate_seq()
        try:
            outcome = await workflow.execute_activity_method(
                SessionActivities.run_tool,
                ToolInput(session_id=state.session_id, turn=state.turn,
                          assistant_seq=reply.seq, tool_use_id=call.id, result_seq=seq,
                          upto_seq=state.recorded_upto,
                          memory_scope=state.config.memory_scope,
                          live_from_seq=self.live_from_seq()),
                **tool_call(call.name))
            state.context_tokens += outcome.token_count
            self.run.events.emit(ToolResult, turn=state.turn, tool_use_id=call.id,
                                name=call.name, output=outcome.preview,
                                is_error=outcome.is_error)
        except ActivityError as err:
            # The model gets an error result for this call from context assembly; the
            # record gets a notice at the result's seq, which no late result can fill.
            self.run.last_error = f"tool {call.name} failed: {_cause(err)}"
            self.run.events.emit(ToolResult, turn=state.turn, tool_use_id=call.id,
                                name=call.name, output=self.run.last_error, is_error=True)
            await self.fence(seq, f"The tool call {call.name} failed: {_cause(err)}")
            return
        state.settle_seq(seq)

    def _fold_result(self, reply: ModelReply, call: ToolCall, text: str,
                     is_error: bool) -> bool:
        """A delegate call's result (a short line of Keel's) written by the turn's next
        model call, with the child's answer folded beside it (workflows.delegation), not by
        an activity and a workflow task of its own. Only for the reply's last call, while
        the session goes on (the next thing that reads the record is that model call; a
        checkpoint, continue-as-new or the end records it first, the ordinary way).
        False: record it the ordinary way."""
        state = self.run.state
        if (call.name != "delegate" or self.fold_row is None or state.stopped_reason
                or state.ended or call.id != reply.tool_calls[-1].id
                or len(text) > DEFAULT_OUTPUT_CAP_CHARS
                or not workflow.patched(ROUND_TRIP_PATCH)):
            return False
        seq = state.allocate_seq()
        self.fold_row(RecordInput(
            session_id=state.session_id, seq=seq, input_id=f"result-{call.id}",
            type=MessageType.TOOL_RESULT, text=make_storable(text)[0], turn=state.turn,
            content={"tool_use_id": call.id, "is_error": is_error, "tool": call.name,
                     "cut": False}, user_name=state.config.user_name))
        self.run.events.emit(ToolResult, turn=state.turn, tool_use_id=call.id,
                             name=call.name, output=text, is_error=is_error)
        if is_error:
            self.run.last_error = f"tool {call.name}: {text[:300]}"
        return True

    async def _harness(self, text: str, input_id: str) -> None:
        """A line the model (and a checkpoint's turn) reads, in Keel's own voice: a harness
        row, not an input that asks for a turn."""
        state = self.run.state
        seq = state.allocate_seq()
        try:
            inserted = await workflow.execute_activity_method(
                SessionActivities.record_input,
                RecordInput(session_id=state.session_id, seq=seq, input_id=input_id,
                            type=MessageType.HARNESS, text=text,
                            source_line=APPROVAL_SOURCE_LINE, turn=state.turn),
                **RECORD_NOTICE)
            state.context_tokens += inserted.token_count
        except ActivityError as err:
            workflow.logger.error("approval line not recorded: %s", err)
        state.settle_seq(seq)

    async def _keep_whole(self, call: ToolCall, text: str, cap: int,
                          meta: dict[str, Any] | None) -> tuple[str, int, dict[str, Any]]:
        """A result over its cap: the whole text into the workspace, and the cut result
        saying where; the record then keeps the cut text as is. When the workspace does
        not take it, the record cuts it as before and the rest is lost."""
        try:
            path = await workflow.execute_activity_method(
                FileActivities.keep_tool_result,
                KeepResultInput(session_id=self.run.state.session_id, call_id=call.id,
                                text=text), **FILE_CALL)
        except ActivityError as err:
            workflow.logger.warning("the whole result of %s not kept: %s", call.id,
                                    err.cause or err)
            return text, cap, meta or {}
        cut, _ = cut_result(text, cap, f"the whole result is in {path}; read it with "
                                       "read_file")
        return cut, len(cut), {**(meta or {}), "cut": True, "whole_result": path}

    async def _result(self, call: ToolCall, text: str, *, is_error: bool,
                      cap: int = DEFAULT_OUTPUT_CAP_CHARS,
                      meta: dict[str, Any] | None = None,
                      ref: dict[str, str] | None = None,
                      files: list[dict[str, str]] | None = None) -> None:
        """Record the call's result; one kept by reference (`ref`) is read, kept whole and
        cut by the record activity, and said on the stream by its preview. `files`: a
        service tool's (names, base64), put in the workspace and the row by the record."""
        state = self.run.state
        if ref is None and len(text) > cap:
            text, cap, meta = await self._keep_whole(call, text, cap, meta)
        seq = state.allocate_seq()
        try:
            outcome = await workflow.execute_activity_method(
                SessionActivities.record_tool_result,
                ToolResultInput(session_id=state.session_id, turn=state.turn,
                                tool_use_id=call.id, result_seq=seq, tool=call.name,
                                text=text, is_error=is_error, cap=cap, meta=meta or {},
                                ref=ref, files=files or []),
                **RECORD_TOOL_RESULT)
            state.context_tokens += outcome.token_count
            if ref is not None:
                text, is_error = outcome.preview, outcome.is_error
        except ActivityError as err:
            self.run.last_error = f"tool {call.name}: result not recorded: {err.cause or err}"
            if ref is not None:
                text = self.run.last_error
        state.settle_seq(seq)
        self.run.events.emit(ToolResult, turn=state.turn, tool_use_id=call.id, name=call.name,
                            output=text, is_error=is_error)
        if is_error:
            self.run.last_error = f"tool {call.name}: {text[:300]}"
