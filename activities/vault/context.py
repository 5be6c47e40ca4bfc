"""The activities' shared context: settings, one scope's vault, and the database.

A memory activity reaches a vault only through `MemoryContext.scoped(scope)`, with the
scope from the activity's input (the workflow takes it from the session's config or the
schedule, never from the model); each scope's `Vault`, with its change cache, is made once
per context. Also here: which scopes have a vault folder, and a scope's CORE.md as the
system prompt carries it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from temporalio.exceptions import ApplicationError

from activities.db import connection, get_pool
from activities.vault.embedder import embedder_for
from activities.vault.files import read_text
from activities.vault.store import Vault
from schemas.config import KeelSettings
from schemas.vault.schema import CORE_FILE
from schemas.vault.scope import DEFAULT_SCOPE, ScopeError, check_scope, is_scope
from schemas.vault.settings import MemorySettings


@dataclass
class MemoryContext:
    """What every memory activity needs: settings, one scope's vault, and the database.

    The worker builds one for the default scope; `scoped(scope)` gives (and keeps) the
    context of any other, so each scope's vault object, with its change cache, is made once.
    """

    settings: KeelSettings
    database_url: str
    scope: str = DEFAULT_SCOPE
    vault: Vault = field(init=False)
    _scopes: dict[str, MemoryContext] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        check_scope(self.scope)
        self.vault = Vault(self.memory.vault_dir_for(self.scope), self.memory, self.scope,
                           embedder_for(self.memory))
        self._scopes.setdefault(self.scope, self)

    def scoped(self, scope: str) -> MemoryContext:
        """The context of `scope` (ScopeError, a ValueError, for an id that is not one)."""
        if scope == self.scope:
            return self
        if scope in self._scopes:
            return self._scopes[scope]
        try:
            check_scope(scope)
        except ScopeError as err:
            raise ApplicationError(str(err), type="InvalidScope", non_retryable=True) from err
        found = MemoryContext(self.settings, self.database_url, scope)
        found._scopes = self._scopes
        self._scopes[scope] = found
        return found

    @property
    def memory(self) -> MemorySettings:
        return self.settings.memory

    async def pool(self) -> AsyncConnectionPool:
        return await get_pool(self.database_url)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        """A connection from the database's pool, given back when the block ends (waited
        for within the activity's attempt: activities.db.connection)."""
        async with connection(self.database_url) as conn:
            yield conn


def scope_vaults(memory: MemorySettings) -> dict[str, Path]:
    """Every scope that has a vault folder, by id: the default scope's when its folder
    exists, and each folder under the vaults root whose name is a scope id."""
    out: dict[str, Path] = {}
    if memory.vault_dir.is_dir():
        out[DEFAULT_SCOPE] = memory.vault_dir
    root = memory.vaults_root()
    if root.is_dir():
        for child in sorted(root.iterdir()):
            if child.is_dir() and is_scope(child.name) and child.name != DEFAULT_SCOPE:
                out[child.name] = child
    return dict(sorted(out.items()))


def read_core_text(settings: KeelSettings, scope: str = DEFAULT_SCOPE) -> str:
    """One scope's CORE.md as it goes in the system prompt ("" when it has none yet)."""
    path = settings.memory.vault_dir_for(scope) / CORE_FILE
    if not path.exists():
        return ""
    return read_text(path).text.strip()
