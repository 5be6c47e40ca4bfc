"""The agent spec a service gives a session at start, and the pure rules around it: which
tools the model sees, where a call runs, which calls need a person's approval, and whether a
call's input fits its tool's schema. No I/O.

Invariants:
- A spec never holds a secret: a provider is a profile *name* the worker resolves, an MCP
  server names its environment variables (schemas/mcp.py). A field the spec does not know
  (a top-level `api_key`) is refused naming it, and a secret written into a value is among
  `spec_problems` (schemas.strict), so neither is dropped without a word.
- `session_tools` is the one place the session's tool list is made; the model call and the
  checkpoint turn both call it, so the two requests carry the same tools.
- Tool names are unique across built-ins, service tools and MCP tools; MCP names are
  namespaced `mcp__<server>__<tool>` and so cannot clash with the others.
- `approval_for` is the one place a call's policy is decided: the spec's `approvals.tools`
  entry, else the service tool's own declaration, else `approvals.default_mcp` for an MCP
  tool, else allow (Keel's built-ins default to allow).
- An approval is bound to the exact call: its id and the digest of its input.

These models travel in workflow input and state (Temporal histories): add fields only as
optional with defaults, never rename or remove one.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field

from schemas.budget import BudgetSpec, Spend, child_budget
from schemas.cache_ttl import CacheTtl
from schemas.initiative import (
    INITIATIVE_TOOL_NAMES,
    DelegationLimits,
    SubAgent,
    WakeupLimits,
    initiative_tools,
    sub_agent_problems,
)
from schemas.interrupt import InterruptPolicy
from schemas.mcp import (
    API_TOOL_NAME_RE,
    McpServerSpec,
    McpTool,
    parse_namespaced,
    server_secret_problems,
)
from schemas.strict import SpecModel, secret_problem
from schemas.tools import AGENT_TOOLS, MEMORY_GET_TOOL, MEMORY_SEARCH_TOOL

DEFAULT_OUTPUT_CAP_CHARS = 20_000
MAX_INSTRUCTIONS_CHARS = 50_000
DEFAULT_PROVIDER = "default"
OFFLINE_PROVIDER = "offline"  # always known: the offline deterministic model
# Keel's built-in tools by name (write_card's schema is the vault's, made by the worker).
BUILTIN_TOOL_NAMES: list[str] = [t["name"] for t in AGENT_TOOLS] + [
    MEMORY_SEARCH_TOOL["name"], MEMORY_GET_TOOL["name"], "write_card"]


class ApprovalPolicy(StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


class ServiceTool(SpecModel):
    """A tool a service serves itself: an activity type on a task queue of its own worker,
    in any Temporal SDK language. Keel calls it with a `ServiceToolCall` and takes back a
    `ServiceToolResult` (or any JSON value, or text)."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    activity: str  # the activity type name
    task_queue: str
    timeout_s: float = Field(default=60.0, gt=0, le=3600)  # one attempt
    schedule_to_close_s: float = Field(default=300.0, gt=0, le=86_400)  # waiting included
    max_attempts: int = Field(default=1, ge=1, le=20)  # side effects: once, unless told
    approval: ApprovalPolicy = ApprovalPolicy.ALLOW
    output_cap_chars: int = Field(default=DEFAULT_OUTPUT_CAP_CHARS, ge=100, le=400_000)

    def to_anthropic(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "input_schema": self.input_schema}


class ApprovalRules(SpecModel):
    tools: dict[str, ApprovalPolicy] = Field(default_factory=dict)  # by the model's name
    default_mcp: ApprovalPolicy = ApprovalPolicy.ALLOW
    timeout_s: float | None = Field(default=None, gt=0)  # then `on_timeout` applies
    on_timeout: Literal["deny", "allow"] = "deny"


class AgentSpec(SpecModel):
    """How a session's agent is shaped: given at start, readable by a query, changeable for
    later turns by an Update."""

    instructions: str = ""  # after Keel's identity and rules; never condensed
    model: str | None = None
    # Asked instead of `model` from a model call's third attempt on, when the first two
    # failed in a way a retry could help: overloaded, rate-limited, a server error, no
    # answer (schemas.model.model_for_attempt). Through the same provider; it should take
    # the session's window. None: the worker's KEEL_FALLBACK_MODEL, if any.
    fallback_model: str | None = Field(default=None, min_length=1, max_length=256)
    provider: str | None = None  # a profile name the worker maps to base URL and key
    context_window: int | None = Field(default=None, ge=4_096)
    max_output_tokens: int | None = Field(default=None, ge=256)
    builtin_tools: list[str] | None = None  # None: all of Keel's built-ins
    tools: list[ServiceTool] = Field(default_factory=list)
    mcp_servers: list[McpServerSpec] = Field(default_factory=list)
    approvals: ApprovalRules = Field(default_factory=ApprovalRules)
    budget: BudgetSpec | None = None  # schemas.budget: per session and per turn
    on_busy: InterruptPolicy | None = None  # schemas.interrupt; None: enqueue
    wakeups: WakeupLimits | None = None  # None: no wakeup tools (schemas.initiative)
    sub_agents: list[SubAgent] = Field(default_factory=list)  # the delegate tool's agents
    delegation: DelegationLimits = Field(default_factory=DelegationLimits)
    # How long the prompt cache keeps the context (schemas.cache_ttl); None: the session's
    # setting (`auto` unless its service chose).
    prompt_cache_ttl: CacheTtl | None = None


def fallback_model(spec: AgentSpec | None, worker: str | None) -> str | None:
    """The model a session's calls turn to when theirs keeps failing: its agent's, else the
    worker's (KEEL_FALLBACK_MODEL)."""
    return (spec.fallback_model if spec is not None else None) or worker


class AgentSpecError(ValueError):
    """A spec Keel refuses at start: every problem listed, nothing started."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("the agent spec is refused: " + "; ".join(problems))


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why `schema` is no usable tool input schema, or None."""
    if schema.get("type", "object") != "object":
        return f"its input schema's root type is {schema.get('type')!r}, not 'object'"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as err:
        return f"its input schema is invalid: {err.message}"
    return None


def spec_problems(spec: AgentSpec, builtin_names: list[str],
                  providers: list[str] | None = None) -> list[str]:
    """Every reason to refuse `spec`; `providers` are the known profile names (None: do not
    check them)."""
    problems: list[str] = []
    if len(spec.instructions) > MAX_INSTRUCTIONS_CHARS:
        problems.append(f"instructions have {len(spec.instructions)} characters; the limit "
                        f"is {MAX_INSTRUCTIONS_CHARS}")
    for name in spec.builtin_tools or []:
        if name not in builtin_names:
            problems.append(f"built-in tool {name!r} does not exist (there are: "
                            f"{', '.join(builtin_names)})")
    seen = set(spec.builtin_tools if spec.builtin_tools is not None else builtin_names)
    for tool in spec.tools:
        if not API_TOOL_NAME_RE.match(tool.name) or tool.name.startswith("mcp__"):
            problems.append(f"tool name {tool.name!r} must match {API_TOOL_NAME_RE.pattern} "
                            "and not start with 'mcp__'")
        if tool.name in seen or tool.name in builtin_names \
                or tool.name in INITIATIVE_TOOL_NAMES:
            problems.append(f"tool name {tool.name!r} is declared twice")
        seen.add(tool.name)
        problem = schema_problem(tool.input_schema)
        if problem:
            problems.append(f"tool {tool.name!r}: {problem}")
        if not tool.activity or not tool.task_queue:
            problems.append(f"tool {tool.name!r} needs an activity and a task queue")
    servers = [s.name for s in spec.mcp_servers]
    for name in sorted({n for n in servers if servers.count(n) > 1}):
        problems.append(f"MCP server {name!r} is declared twice")
    for name in spec.approvals.tools:
        if parse_namespaced(name) is None and name not in seen \
                and name not in INITIATIVE_TOOL_NAMES:
            problems.append(f"approval rule for {name!r}: no such tool")
    problems += sub_agent_problems(spec.sub_agents, sorted(seen & set(builtin_names)),
                                   [t.name for t in spec.tools])
    problems += _secret_problems(spec)
    if providers is not None and spec.provider is not None \
            and spec.provider not in providers:
        problems.append(f"provider profile {spec.provider!r} is unknown to this Keel "
                        f"(known: {', '.join(sorted(providers))})")
    return problems


def _secret_problems(spec: AgentSpec) -> list[str]:
    """Every secret written into the spec's values, by field (schemas.strict)."""
    problems = [f"{field}: {why}; name a provider profile or an environment variable instead"
                for field, value in (("provider", spec.provider), ("model", spec.model),
                                     ("fallback_model", spec.fallback_model))
                if value and (why := secret_problem(value))]
    for i, tool in enumerate(spec.tools):
        for field in ("activity", "task_queue", "description"):
            if why := secret_problem(getattr(tool, field)):
                problems.append(f"tools[{i}].{field} ({tool.name!r}): {why}")
    for server in spec.mcp_servers:
        problems += server_secret_problems(server)
    for agent in spec.sub_agents:
        if agent.model and (why := secret_problem(agent.model)):
            problems.append(f"sub_agents ({agent.name!r}).model: {why}")
    return problems


def check_spec(spec: AgentSpec, builtin_names: list[str],
               providers: list[str] | None = None) -> AgentSpec:
    problems = spec_problems(spec, builtin_names, providers)
    if problems:
        raise AgentSpecError(problems)
    return spec


def session_tools(builtin: list[dict[str, Any]], spec: AgentSpec | None,
                  mcp_tools: list[McpTool]) -> list[dict[str, Any]]:
    """The session's tool list, in a fixed order: built-ins, service tools, MCP tools (of
    the servers the spec declares now: one removed offers none, even before a listing)."""
    if spec is None:
        return list(builtin)
    keep = spec.builtin_tools
    servers = {s.name for s in spec.mcp_servers}
    out = [t for t in builtin if keep is None or t["name"] in keep]
    out += initiative_tools(spec.wakeups, spec.sub_agents)
    out += [t.to_anthropic() for t in spec.tools]
    out += [t.to_anthropic() for t in mcp_tools if t.server in servers]
    return out


class ToolKind(StrEnum):
    BUILTIN = "builtin"
    SERVICE = "service"
    MCP = "mcp"
    UNKNOWN = "unknown"


class ToolRoute(BaseModel):
    kind: ToolKind
    service: ServiceTool | None = None
    mcp: McpTool | None = None
    mcp_server: McpServerSpec | None = None
    input_schema: dict[str, Any] | None = None


def route(name: str, builtin: list[dict[str, Any]], spec: AgentSpec | None,
          mcp_tools: list[McpTool]) -> ToolRoute:
    """Where a call of `name` runs; UNKNOWN when the session offers no such tool."""
    offered = session_tools(builtin, spec, mcp_tools)
    if not any(t["name"] == name for t in offered):
        return ToolRoute(kind=ToolKind.UNKNOWN)
    if spec is not None:
        for tool in spec.tools:
            if tool.name == name:
                return ToolRoute(kind=ToolKind.SERVICE, service=tool,
                                 input_schema=tool.input_schema)
        for mcp in mcp_tools:
            if mcp.name == name:
                server = next((s for s in spec.mcp_servers if s.name == mcp.server), None)
                if server is None:
                    return ToolRoute(kind=ToolKind.UNKNOWN)
                return ToolRoute(kind=ToolKind.MCP, mcp=mcp, mcp_server=server,
                                 input_schema=mcp.input_schema)
    schema = next(t["input_schema"] for t in offered if t["name"] == name)
    return ToolRoute(kind=ToolKind.BUILTIN, input_schema=schema)


def approval_for(spec: AgentSpec | None, name: str) -> ApprovalPolicy:
    if spec is None:
        return ApprovalPolicy.ALLOW
    if name in spec.approvals.tools:
        return spec.approvals.tools[name]
    for tool in spec.tools:
        if tool.name == name:
            return tool.approval
    if parse_namespaced(name) is not None:
        return spec.approvals.default_mcp
    return ApprovalPolicy.ALLOW


def input_problem(schema: dict[str, Any] | None, data: dict[str, Any]) -> str | None:
    """Why `data` does not fit `schema`, naming the field, or None. Pure and deterministic.
    A schema that cannot be applied at all (a draft-3 boolean `required` where a later
    draft wants a list, a keyword of the wrong type) is said so, never raised."""
    if not schema:
        return None
    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
        errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    except (jsonschema.SchemaError, TypeError, ValueError, KeyError, AttributeError,
            RecursionError) as broken:
        return (f"the tool's input schema cannot be applied ({type(broken).__name__}: "
                f"{str(broken)[:200]}); the call was not run")
    if not errors:
        return None
    err = errors[0]
    where = "/".join(str(p) for p in err.absolute_path) or "(the input)"
    names = err.validator_value
    if err.validator == "required" and isinstance(err.instance, dict) \
            and isinstance(names, list):
        # A draft-3 schema's `required` is a boolean on the property: the path names it.
        missing = [r for r in names if isinstance(r, str) and r not in err.instance]
        if missing:
            where = "/".join([*map(str, err.absolute_path), missing[0]])
    return f"input does not match the tool's schema at field '{where}': {err.message}"


def input_digest(data: dict[str, Any]) -> str:
    """The digest an approval is bound to: canonical JSON of the call's input."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cut_result(text: str, cap: int, pointer: str) -> tuple[str, bool]:
    """`text` cut to `cap` characters with a line saying so and where the rest is."""
    if len(text) <= cap:
        return text, False
    return (f"{text[:cap]}\n[result cut at {cap} of {len(text)} characters; {pointer}]",
            True)


# ----- approvals ------------------------------------------------------------------------

class PendingApproval(BaseModel):
    """A call that waits on a person's decision."""

    call_id: str
    tool: str
    input: dict[str, Any] = Field(default_factory=dict)
    input_digest: str
    since: datetime
    turn: int = 0
    timeout_s: float | None = None


class ApprovalDecision(BaseModel):
    """A person's decision on one pending call. `input_digest`, when given, must match the
    pending call's: the decision is about exactly the input that was reviewed."""

    call_id: str
    approve: bool
    note: str = ""
    input_digest: str | None = None
    by: str = ""


class DecisionRecorded(BaseModel):
    call_id: str
    approve: bool
    tool: str


def decision_problem(pending: list[PendingApproval], decided: list[str],
                     decision: ApprovalDecision) -> str | None:
    """Why `decision` cannot be taken, or None."""
    if decision.call_id in decided:
        return f"call {decision.call_id} was already decided"
    found = next((p for p in pending if p.call_id == decision.call_id), None)
    if found is None:
        return f"call {decision.call_id} is not pending approval"
    if decision.input_digest is not None and decision.input_digest != found.input_digest:
        return (f"call {decision.call_id}: the decision was for input {decision.input_digest}, "
                f"the pending call's input is {found.input_digest}")
    return None


def denied_text(tool: str, note: str, *, by_policy: bool = False) -> str:
    if by_policy:
        return f"The call of {tool} is not allowed in this session (policy: deny)."
    return f"A person denied the call of {tool}." + (f" Their note: {note}" if note else "")


APPROVAL_SOURCE_LINE = "[Harness: Approval]"
WAIT_NOTICE_TAG = "[Keel: waiting on a person's approval]"
DECIDED_NOTICE_TAG = "[Keel: approval decided]"


def approval_wait_notice(p: PendingApproval) -> str:
    """The record's harness line while a call waits: what a checkpoint taken meanwhile
    reads, so its now lists the call under Waiting on."""
    return (f"{WAIT_NOTICE_TAG} {p.tool} (call {p.call_id}, input "
            f"{json.dumps(p.input, ensure_ascii=False)[:300]}) since "
            f"{p.since.isoformat(timespec='seconds')}; the turn goes on once a person "
            "approves or denies it.")


def approval_decided_notice(p: PendingApproval, decision: ApprovalDecision) -> str:
    verdict = "approved" if decision.approve else "denied"
    by = f" by {decision.by}" if decision.by else ""
    note = f" Note: {decision.note}" if decision.note else ""
    return f"{DECIDED_NOTICE_TAG} call {p.call_id} ({p.tool}): {verdict}{by}.{note}"


# ----- the service-tool activity contract (any SDK language speaks this JSON) ----------

class ServiceToolCall(BaseModel):
    """What Keel sends a service tool's activity: `{"session_id", "call_id", "tool",
    "input"}`."""

    session_id: str
    call_id: str
    tool: str
    input: dict[str, Any] = Field(default_factory=dict)


class ToolFile(BaseModel):
    """A file a service tool returns for the model to see with its result: an image (PNG,
    JPEG, GIF, WebP), a PDF or UTF-8 text, its kind read from its bytes. In JSON its
    bytes are base64 (`{"name": "chart.png", "data": "iVBORw0..."}`, either alphabet)."""

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    name: str
    data: bytes


class ServiceToolResult(BaseModel):
    """What a service tool's activity may return. Plain text or any other JSON value is
    taken too: text as it is, other JSON as JSON text."""

    text: str = ""
    is_error: bool = False
    data: Any = None  # JSON, shown to the model after the text
    # Shown to the model inside the result, as a message's files are (schemas.attachments);
    # one the model would refuse is a line of the result saying why.
    files: list[ToolFile] = Field(default_factory=list)


# A service tool's result too large to carry inline travels by reference: the service's
# worker keeps it in Keel's store (workers.payload_refs.ResultStorage), and a Keel worker
# reads the reference as this small pointer, `{RESULT_REF_KEY: {scope, path, sha256,
# size}}`, which the workflow carries and the record activity resolves.
RESULT_REF_KEY = "keel_result_ref"
RESULT_REF_FIELDS = frozenset({"scope", "path", "sha256", "size"})


def result_ref(value: Any) -> dict[str, str] | None:
    """The pointer `value` is (see RESULT_REF_KEY), or None when it is a result itself."""
    if not isinstance(value, dict) or set(value) != {RESULT_REF_KEY}:
        return None
    ref = value[RESULT_REF_KEY]
    if not isinstance(ref, dict) or set(ref) != RESULT_REF_FIELDS \
            or not all(isinstance(v, str) for v in ref.values()):
        return None
    return {str(k): str(v) for k, v in ref.items()}


_RESULT_KEYS = frozenset({"text", "is_error", "data"})


def result_files(value: Any) -> list[dict[str, str]]:
    """The files of what a service tool's activity returned (a ServiceToolResult's, in its
    JSON: names and base64), [] when it is no such result; the value is then plain JSON."""
    if not (isinstance(value, dict) and "files" in value
            and set(value) - {"files"} <= _RESULT_KEYS and isinstance(value["files"], list)):
        return []
    files = value["files"]
    if not all(isinstance(f, dict) and set(f) == {"name", "data"}
               and all(isinstance(v, str) for v in f.values()) for f in files):
        return []
    return [{"name": f["name"], "data": f["data"]} for f in files]


def result_text(value: Any) -> tuple[str, bool]:
    """(text, is_error) of what a service tool's activity returned (its files apart:
    `result_files`)."""
    if isinstance(value, str):
        return value, False
    if isinstance(value, dict) and "files" in value and (
            result_files(value) or value["files"] == []):
        value = {k: v for k, v in value.items() if k != "files"}
    if isinstance(value, dict) and set(value) <= _RESULT_KEYS and (
            "text" in value or "data" in value):
        text = str(value.get("text") or "")
        if value.get("data") is not None:
            data = json.dumps(value["data"], ensure_ascii=False, default=str)
            text = f"{text}\n{data}" if text else data
        return text, bool(value.get("is_error"))
    return json.dumps(value, ensure_ascii=False, default=str), False


def spec_from_text(text: str, suffix: str) -> AgentSpec:
    """An AgentSpec from a TOML (`.toml`) or JSON file's text."""
    if suffix.lower() == ".toml":
        import tomllib

        return AgentSpec.model_validate(tomllib.loads(text))
    return AgentSpec.model_validate_json(text)


CHILD_NOTE = ("You are a sub-agent: another agent delegated one task to you. Work on it, "
              "then give your final answer as your reply; it goes back to that agent.")


def child_spec(parent: AgentSpec, agent: SubAgent, depth: int,
               spent: Spend | None = None) -> AgentSpec:
    """The spec of a child session for `agent`: a subset of its parent's (its tools among
    the parent's, the parent's approvals and limits), with no wakeups, sub-agents of its
    own only while the depth limit allows one more level, and a share of what the parent
    has left of its budget (`spent`: the parent's spend so far; schemas.budget)."""
    return parent.model_copy(update={
        "budget": child_budget(parent.budget, spent or Spend()),
        "instructions": f"{agent.instructions or parent.instructions}\n\n{CHILD_NOTE}".strip(),
        "model": agent.model or parent.model,
        "builtin_tools": agent.builtin_tools if agent.builtin_tools is not None
        else parent.builtin_tools,
        "tools": [t for t in parent.tools if agent.tools is None or t.name in agent.tools],
        "wakeups": None,
        "sub_agents": parent.sub_agents if depth < parent.delegation.max_depth else [],
    })
