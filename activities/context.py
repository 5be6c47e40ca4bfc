"""The session context: what the session's and the checkpoint's activities share, built
once per worker process and passed to both (collaborators passed in, never reached for).

It holds the settings, the model (a `ModelBackend` the worker chose, activities.model), the
record's connection pool (`connection()`; the pool itself is
the process's one per URL, activities.db), the sessions' workspace store, the system
prompt and tool registry (activities.prompt), the window loader (activities.window), long
memory's context and the embedder of hybrid recall. The store and the memory context are
opened on first use, so a worker can be built before its database answers.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

from psycopg import AsyncConnection
from temporalio.exceptions import ApplicationError

from activities.db import connection
from activities.model import ModelBackend
from activities.prompt import SessionPrompt
from activities.row_cache import row_cache
from activities.vault.context import MemoryContext
from activities.vault.embedder import Embedder, embedder_for
from activities.window import WindowLoader
from activities.workspace import WorkspaceStore, open_store
from schemas.config import KeelSettings

__all__ = ["SessionContext"]


class SessionContext:
    """One process's settings (database, model, folders) and what is built from them."""

    def __init__(self, settings: KeelSettings, *, model: ModelBackend,
                 store: WorkspaceStore | None = None,
                 memory: MemoryContext | None = None) -> None:
        self.settings = settings
        self.model = model
        self._store = store
        self._memory = memory
        self.prompt = SessionPrompt(lambda: self.store, offline=settings.model.offline)
        self.windows = WindowLoader(self.prompt)
        # The deployment's embedding model (None: BM25 only), loaded once per process.
        self.embedder: Embedder | None = embedder_for(settings.memory)
        # The process's one row cache (activities.window reads through it), sized here.
        row_cache.max_chars = settings.row_cache_chars

    async def connection(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """A connection from the pool (`async with await ctx.connection() as conn`), waited
        for within the activity's attempt (activities.db.connection)."""
        if not self.settings.database_url:
            raise ApplicationError("DATABASE_URL is not set", non_retryable=True)
        return connection(self.settings.database_url)

    @property
    def store(self) -> WorkspaceStore:
        """The sessions' files (activities.workspace), the same on every worker."""
        if self._store is None:
            self._store = open_store(self.settings)
        return self._store

    def memory(self) -> MemoryContext:
        if self._memory is None:
            assert self.settings.database_url
            self._memory = MemoryContext(settings=self.settings,
                                         database_url=self.settings.database_url)
        return self._memory
