"""The session's system prompt and tools: the one place every request of a session (its
model calls, the checkpoint turn, the memory flush) takes them from.

The system prompt carries the core memory of the session's scope as the session's row last
said it (`remember_scope`, written by every window load; none while not known) and the
agent's instructions; its AGENTS.md files come from point reads of the files the store
knows (activities.workspace), never a listing of the workspace, which would grow with its
files. A model call reads all of it at once (`files`: one store read, one round trip). The
tools are Keel's built-ins (write_card's enums from the scope's schema.json, as
the vault worker published it: the same on every worker) filtered and extended by the
session's agent (`schemas.agent.session_tools`). A session without long memory gets no
memory tools and no core memory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from activities.tools import Skill, load_skills, skills_of
from activities.vault.store import TEMPLATE_DIR
from activities.vault_share import shared_path, shared_vault_text
from activities.workspace import PromptFiles, WorkspaceStore
from schemas.agent import AgentSpec, session_tools
from schemas.context import (
    SkillEntry,
    SystemPromptParts,
    WorkspaceDoc,
    agents_md_budget,
    build_system_prompt,
    skills_budget,
)
from schemas.mcp import McpTool
from schemas.tools import AGENT_TOOLS, MEMORY_GET_TOOL, MEMORY_SEARCH_TOOL
from schemas.vault.rollup import write_card_tool
from schemas.vault.schema import CORE_FILE, SCHEMA_FILE, parse_schema
from schemas.vault.scope import DEFAULT_SCOPE

__all__ = ["OFFLINE_NOTICE", "PACKAGED_SKILLS", "SessionPrompt"]

PACKAGED_SKILLS = Path(__file__).resolve().parent.parent / "keel" / "skills"
OFFLINE_NOTICE = (
    "Keel runs on its offline deterministic model: no network, replies written by rule."
)


class SessionPrompt:
    """System prompts and tool lists over one workspace store (`store` is called each
    time: the context opens it on first use)."""

    def __init__(self, store: Callable[[], WorkspaceStore], *, offline: bool) -> None:
        self._store = store
        self._offline = offline
        # session id -> scope, as last read from its row (for prompts built without a conn)
        self._scopes: dict[str, str | None] = {}

    def remember_scope(self, session_id: str, scope: str | None) -> None:
        self._scopes[session_id] = scope

    async def skills(self) -> list[Skill]:
        return await load_skills(self._store(), PACKAGED_SKILLS)

    async def files(self, session_id: str) -> PromptFiles:
        """`files_in` the scope as last read from the session's row."""
        return await self.files_in(session_id, self._scopes.get(session_id))

    async def files_in(self, session_id: str, scope: str | None) -> PromptFiles:
        """Everything the session's system prompt and tools read from the store, in one
        read: its AGENTS.md files, the shared skills, `scope`'s published CORE.md and
        schema.json."""
        shared = [] if scope is None else [shared_path(scope, n) for n in (CORE_FILE,
                                                                            SCHEMA_FILE)]
        return await self._store().prompt_files(session_id, shared)

    async def builtin_tools(self, scope: str | None = DEFAULT_SCOPE,
                            files: PromptFiles | None = None) -> list[dict[str, Any]]:
        """Keel's built-in tools; write_card's enums come from the scope's schema.json, as
        the vault worker published it (activities.vault_share): the same on every worker.
        A session without long memory gets no memory tools. `files`: read already."""
        if scope is None:
            return list(AGENT_TOOLS)
        tools = [*AGENT_TOOLS, MEMORY_SEARCH_TOOL, MEMORY_GET_TOOL]
        text = await self._vault_text(scope, SCHEMA_FILE, files)
        if text is None:  # not published yet: a new vault is made from the template's
            text = (TEMPLATE_DIR / SCHEMA_FILE).read_text()
        schema = parse_schema(text)[0]
        if schema is not None:
            tools.append(write_card_tool(schema))
        return tools

    async def _vault_text(self, scope: str, name: str, files: PromptFiles | None,
                          ) -> str | None:
        path = shared_path(scope, name)
        if files is None or path not in files.asked:
            return await shared_vault_text(self._store(), scope, name)
        found = files.shared.get(path)
        return found.decode("utf-8", errors="replace") if found is not None else None

    async def tools(self, scope: str | None = DEFAULT_SCOPE, agent: AgentSpec | None = None,
                    mcp_tools: list[McpTool] | None = None,
                    files: PromptFiles | None = None) -> list[dict[str, Any]]:
        """The session's tools (schemas.agent.session_tools): the one list every request
        of this session carries, the checkpoint turn's included."""
        return session_tools(await self.builtin_tools(scope, files), agent, mcp_tools or [])

    async def session_tools(self, session_id: str, agent: AgentSpec | None = None,
                            mcp_tools: list[McpTool] | None = None) -> list[dict[str, Any]]:
        """The tools of a session whose window was loaded (its scope known from its row)."""
        return await self.tools(self._scopes.get(session_id), agent, mcp_tools)

    async def system_prompt(self, session_id: str, instructions: str = "",
                            files: PromptFiles | None = None,
                            hard_limit: int | None = None) -> str:
        """The system prompt, with the core memory of the session's scope (as last read
        from its row by a window load; none when not known) and the agent's instructions.
        `files`: `files(session_id)` read already. `hard_limit`: the session's window's,
        which bounds its AGENTS.md files (schemas.context.agents_md_budget)."""
        if files is None:
            files = await self.files(session_id)
        agents = [WorkspaceDoc(path=path, text=data.decode("utf-8", errors="replace"))
                  for path, data in sorted(files.agents.items())]
        skills = [SkillEntry(name=s.name, description=s.description)
                  for s in skills_of(files.shared, PACKAGED_SKILLS)]
        return build_system_prompt(SystemPromptParts(
            skills=skills, agents_md=agents,
            core_memory=await self.core_memory(self._scopes.get(session_id), files),
            offline_notice=OFFLINE_NOTICE if self._offline else "",
            instructions=instructions, agents_md_tokens=agents_md_budget(hard_limit),
            skills_tokens=skills_budget(hard_limit)))

    async def core_memory(self, scope: str | None = DEFAULT_SCOPE,
                          files: PromptFiles | None = None) -> str:
        """The scope's CORE.md as the vault worker published it; before it has, the
        template's, which a new vault is made from (so the system prompt, the start of
        every cached prefix, does not change when the vault is first published); "" for a
        session without long memory."""
        if scope is None:
            return ""
        text = await self._vault_text(scope, CORE_FILE, files)
        if text is None:
            text = (TEMPLATE_DIR / CORE_FILE).read_text()
        return text.strip()
