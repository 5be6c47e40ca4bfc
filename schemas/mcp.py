"""MCP servers a session may use: their declaration, the namespacing of their tools, and
how a tool is shown to the model. Pure: nothing here reads the environment or the network.

Invariants:
- A declaration never holds a secret: a stdio server's environment and an HTTP server's
  header values are named by environment variable and resolved by the worker at call time.
  A field it does not know (`stdio.env`, `http.headers`) is refused, naming where the value
  belongs (`schemas.strict.SpecModel`), and `server_secret_problems` finds a secret written
  into a value (an argument, the URL, a name that is a token).
- A spec has exactly one transport, `stdio` or `http`.
- A worker reaches a server only as its operator allows (`worker_problem`, `McpReach`):
  never handing it one of Keel's own credentials, a stdio command or an HTTP host only
  from its lists when it has them.
- Warm client sessions are shared only as the declaration allows (`pool_owner`): by default
  a warm session to a server serves one Keel session, and only a declaration that says
  `sharing = "shared"` lets every session of a worker with the same declaration (and the
  same resolved secrets) use the same server process or HTTP session.
- A namespaced tool name is `mcp__<server>__<tool>`; it parses back to exactly the pair it was
  made from, so two servers can never clash. A tool whose namespaced name would break the
  Messages API's rule for tool names (or whose schema the API would refuse, or that is too
  big for workflow state) is reported with its reason, never renamed.

These models travel in activity inputs and workflow state (Temporal histories): add fields
only as optional with defaults, never rename or remove one.
"""

from __future__ import annotations

import json
import re
from fnmatch import fnmatchcase
from typing import Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator, model_validator

from schemas.strict import SpecModel, arg_secret_problems, secret_problem, url_problem

SERVER_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,32}$")
# The Messages API's rule for a tool's name.
API_TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token

# What one tool may bring into workflow state (histories): a longer description is cut,
# a larger input schema is reported and the tool left out.
MAX_DESCRIPTION_CHARS = 4_000
MAX_SCHEMA_CHARS = 50_000

# Closing a session is bounded too: the SDK stops a stdio server in at most ~6.5 s (close
# stdin, 2 s, SIGTERM, 2 s, SIGKILL); the activity gives it this long at most.
CLOSE_TIMEOUT_S = 10.0
# Keeping a call's whole result in the workspace (over its cap) takes at most this long.
KEEP_RESULT_S = 20.0

NAMESPACE_PREFIX = "mcp__"
NAMESPACE_SEP = "__"


def _name_problem(what: str) -> str:
    """A value where a name belongs, said without quoting it (it may well be a secret)."""
    return (f"{what} is not an environment variable name (letters, digits and '_'): a spec "
            "names the variable, and the worker passes its own value")


class McpStdio(SpecModel):
    """Start `command args…` as a subprocess and speak MCP over its stdin/stdout.

    `env_names` are environment variables the worker passes on, by name, with its own values.
    """

    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env_names: list[str] = Field(default_factory=list)

    @field_validator("env_names")
    @classmethod
    def _names_only(cls, names: list[str]) -> list[str]:
        for name in names:
            if not ENV_NAME_RE.match(name):
                raise ValueError(_name_problem("an entry of env_names"))
        return names


class McpHttp(SpecModel):
    """Speak MCP's streamable HTTP transport to `url`.

    `header_env` maps a header name to the environment variable whose value the worker sends.
    """

    url: str = Field(min_length=1)
    header_env: dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError("an MCP server's url must start with http:// or https://")
        authority = url.split("//", 1)[1].split("/", 1)[0]
        if "@" in authority:
            raise ValueError("an MCP server's url may not carry credentials; name them in "
                             "header_env instead")
        return url

    @field_validator("header_env")
    @classmethod
    def _names_only(cls, header_env: dict[str, str]) -> dict[str, str]:
        for header, env_name in header_env.items():
            if not HEADER_NAME_RE.match(header):
                raise ValueError(f"{header!r} is not an HTTP header name")
            if not ENV_NAME_RE.match(env_name):
                raise ValueError(_name_problem(f"the variable for header {header!r}"))
        return header_env


Sharing = Literal["session", "shared"]


class McpServerSpec(SpecModel):
    """One MCP server a session declares. Timeouts are seconds: `connect_s` bounds starting
    or reaching the server and the initialize handshake (waiting for a free warm session
    included), `list_s` the tool listing, `call_s` one tool call.

    Warm sessions (activities.mcp_pool): a worker keeps a client session to the server (a
    running stdio process, an HTTP session) for `keep_warm_s` after its last use, at most
    `max_warm` of them for this declaration; `keep_warm_s = 0` starts a fresh one for
    every listing and call. `sharing = "session"` (the default): a warm session serves one
    Keel session only, so what the server keeps between calls (a page it opened, a
    login, anything it remembers) never reaches another session; `"shared"`: the server
    keeps nothing of a caller's between calls, and every session on the worker may use any
    of its warm sessions."""

    name: str
    stdio: McpStdio | None = None
    http: McpHttp | None = None
    connect_s: float = Field(default=15.0, gt=0, le=300)
    list_s: float = Field(default=15.0, gt=0, le=300)
    call_s: float = Field(default=120.0, gt=0, le=3600)
    sharing: Sharing = "session"
    keep_warm_s: float = Field(default=300.0, ge=0, le=86_400)
    max_warm: int = Field(default=4, ge=1, le=64)

    @field_validator("name")
    @classmethod
    def _server_name(cls, name: str) -> str:
        if not SERVER_NAME_RE.match(name):
            raise ValueError(f"MCP server name {name!r} must match {SERVER_NAME_RE.pattern}")
        if not _server_name_parses(name):
            raise ValueError(f"MCP server name {name!r} may not hold '__' or end in '_': "
                             "its tools' namespaced names would not parse back")
        return name

    @model_validator(mode="after")
    def _one_transport(self) -> Self:
        if (self.stdio is None) == (self.http is None):
            raise ValueError(f"MCP server {self.name!r} needs exactly one of stdio or http")
        return self

    def activity_timeout_s(self, step: Literal["list", "call"]) -> float:
        """A start-to-close timeout for one activity on this server: the spec's own bounds
        plus closing, plus a margin, so the activity's own error result always wins."""
        if step == "list":
            return self.connect_s + self.list_s + CLOSE_TIMEOUT_S + 5.0
        return self.connect_s + self.call_s + CLOSE_TIMEOUT_S + KEEP_RESULT_S + 5.0

    def env_names(self) -> list[str]:
        """Every environment variable this server's declaration names, in order."""
        if self.stdio is not None:
            return list(self.stdio.env_names)
        assert self.http is not None
        return list(self.http.header_env.values())


def transport_identity(spec: McpServerSpec) -> str:
    """What makes two declarations reach the same server the same way: the command, its
    arguments and the names of the variables it is given (stdio), or the URL and the header
    names (HTTP). The server's name, timeouts and pooling are not part of it."""
    transport = spec.stdio if spec.stdio is not None else spec.http
    assert transport is not None
    kind = "stdio" if spec.stdio is not None else "http"
    return json.dumps([kind, transport.model_dump(mode="json")], sort_keys=True)


def pool_owner(spec: McpServerSpec, session_id: str) -> str | None:
    """Whose warm sessions of this server a request may use: `""` (anyone's: the server
    is declared shared), a Keel session's id (that session's only), or None (no warm
    session: one is started for this request and closed after it, as when the caller does
    not say which session it serves)."""
    if spec.keep_warm_s <= 0:
        return None
    if spec.sharing == "shared":
        return ""
    return session_id or None


def server_secret_problems(spec: McpServerSpec) -> list[str]:
    """Every secret written into `spec`'s values, by field (never quoting it): a command or
    argument, an environment variable's or header's name that is a token, the URL."""
    where = f"MCP server {spec.name!r}"
    problems: list[str] = []
    if spec.stdio is not None:
        if why := secret_problem(spec.stdio.command):
            problems.append(f"{where}: stdio.command: {why}")
        for i, why in arg_secret_problems(spec.stdio.args):
            problems.append(f"{where}: stdio.args[{i}]: {why}")
        for i, name in enumerate(spec.stdio.env_names):
            if why := secret_problem(name):
                problems.append(f"{where}: stdio.env_names[{i}]: {why}")
    if spec.http is not None:
        if why := url_problem(spec.http.url):
            problems.append(f"{where}: http.url: {why}")
        for header, name in spec.http.header_env.items():
            if why := secret_problem(name) or secret_problem(header):
                problems.append(f"{where}: http.header_env[{header!r}]: {why}")
    return [f"{p}; a spec names secrets, never holds them (put the value in the worker's "
            "environment and name the variable)" for p in problems]


# The variables that hold Keel's own credentials (the model API's key, the record's and
# Temporal's access, the web UI's token, every provider profile's key): a worker never
# passes one to an MCP server, whatever its declaration names, so a spec cannot send them
# to a command or a URL of its choosing.
KEEL_CREDENTIALS = frozenset({"ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "DATABASE_URL",
                              "TEMPORAL_API_KEY", "TEMPORAL_TLS_KEY", "KEEL_UI_TOKEN"})
_PROVIDER_KEY_RE = re.compile(r"^KEEL_PROVIDER_[A-Za-z0-9_]+_API_KEY$")


def keel_credential(name: str) -> bool:
    return name in KEEL_CREDENTIALS or bool(_PROVIDER_KEY_RE.match(name))


class McpReach(BaseModel):
    """What a worker's operator lets it reach (KEEL_MCP_STDIO_COMMANDS, KEEL_MCP_HTTP_HOSTS):
    None, anything; empty, nothing of that transport."""

    stdio_commands: tuple[str, ...] | None = None  # as a spec writes them
    http_hosts: tuple[str, ...] | None = None  # a URL's host name, `*` patterns allowed


def worker_problem(spec: McpServerSpec, reach: McpReach) -> str | None:
    """Why this worker will not reach `spec`'s server, or None: it names one of Keel's own
    credentials, or its command or host is outside what the worker's `reach` allows. A
    command is matched as written, never by its base name (`/tmp/x/python` is not
    `python`); a host by its name (`*.corp.example` patterns), never by its port."""
    if owned := [name for name in spec.env_names() if keel_credential(name)]:
        return (f"MCP server {spec.name} names {', '.join(owned)}, Keel's own "
                "credential(s): a worker never passes them to an MCP server")
    if spec.stdio is not None:
        what, allowed, setting = "runs a command", reach.stdio_commands, "STDIO_COMMANDS"
        ok = allowed is None or spec.stdio.command in allowed
    else:
        assert spec.http is not None
        host = (urlsplit(spec.http.url).hostname or "").lower()
        what, allowed, setting = "is at a host", reach.http_hosts, "HTTP_HOSTS"
        ok = allowed is None or any(fnmatchcase(host, p.lower()) for p in allowed)
    if ok:
        return None
    if not allowed:
        return (f"MCP server {spec.name} {what}, and this worker reaches none of that kind "
                f"(KEEL_MCP_{setting}=none)")
    return (f"MCP server {spec.name} {what} this worker does not reach (it reaches "
            f"{', '.join(allowed or ())}: KEEL_MCP_{setting})")


def _server_name_parses(server: str) -> bool:
    return NAMESPACE_SEP not in server and not server.endswith("_")


def namespaced_name(server: str, tool: str) -> str:
    """The name the model sees for `tool` of `server`. It may break the API's rule: check
    it with `namespace_problem` first."""
    return f"{NAMESPACE_PREFIX}{server}{NAMESPACE_SEP}{tool}"


def parse_namespaced(name: str) -> tuple[str, str] | None:
    """(server, tool) of a namespaced name; None when `name` is no MCP tool's name.

    The split is at the first `__` after the prefix. A server name holds no `__` and does
    not end in `_` (the spec refuses such names), so every pair `namespace_problem` accepts
    parses back to itself; the tool's own name may hold `__`.
    """
    if not name.startswith(NAMESPACE_PREFIX):
        return None
    rest = name[len(NAMESPACE_PREFIX):]
    server, sep, tool = rest.partition(NAMESPACE_SEP)
    if not sep or not server or not tool or not SERVER_NAME_RE.match(server):
        return None
    return server, tool


def namespace_problem(server: str, tool: str) -> str | None:
    """Why `tool` of `server` cannot be offered to the model, or None when it can."""
    if not SERVER_NAME_RE.match(server) or not _server_name_parses(server):
        return f"server name {server!r} is not a valid MCP server name"
    if not tool:
        return "the server offered a tool with an empty name"
    name = namespaced_name(server, tool)
    if not API_TOOL_NAME_RE.match(name):
        if len(name) > 128:
            return (f"tool {tool!r} of server {server!r}: its namespaced name {name[:60]!r}… "
                    f"is {len(name)} characters, over the model API's 128")
        return (f"tool {tool!r} of server {server!r}: its namespaced name holds characters "
                "the model API refuses (only letters, digits, '_' and '-')")
    if parse_namespaced(name) != (server, tool):
        return f"tool {tool!r} of server {server!r}: its namespaced name would not parse back"
    return None


class McpTool(BaseModel):
    """One tool an MCP server offers, as the session keeps it."""

    name: str  # namespaced: what the model calls
    server: str
    original_name: str  # what the server calls it
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})

    def to_anthropic(self) -> dict[str, Any]:
        """The Messages API's tool definition."""
        schema = dict(self.input_schema) if self.input_schema else {}
        schema.setdefault("type", "object")
        return {"name": self.name, "description": self.description, "input_schema": schema}


def make_tool(server: str, tool: str, description: str | None,
              input_schema: dict[str, Any] | None) -> McpTool | str:
    """An `McpTool`, or the reason (text) the tool cannot be offered to the model."""
    problem = namespace_problem(server, tool)
    if problem is not None:
        return problem
    schema = input_schema or {"type": "object"}
    if schema.get("type", "object") != "object":
        return (f"tool {tool!r} of server {server!r}: its input schema's root is "
                f"{schema.get('type')!r}, and the model API takes only an object")
    size = len(json.dumps(schema, default=str))
    if size > MAX_SCHEMA_CHARS:
        return (f"tool {tool!r} of server {server!r}: its input schema is {size} characters, "
                f"over {MAX_SCHEMA_CHARS}")
    text = description or ""
    if len(text) > MAX_DESCRIPTION_CHARS:
        text = text[:MAX_DESCRIPTION_CHARS] + " [description cut]"
    return McpTool(name=namespaced_name(server, tool), server=server, original_name=tool,
                   description=text, input_schema=schema)


def anthropic_tools(tools: list[McpTool]) -> list[dict[str, Any]]:
    return [tool.to_anthropic() for tool in tools]
