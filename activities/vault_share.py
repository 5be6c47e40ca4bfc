"""The vault files every session worker needs for its prompt and tools (CORE.md, the
vault's schema.json), shared through the workspace store.

Invariants:
- Only the vault worker reads the vault folders and publishes (`publish_vault_files`);
  session workers read the copies from the store's shared area
  (`vault-copies/<scope>/...`), so every worker on every host builds the same system
  prompt and tools, and none touches a vault.
- Publishing writes only what changed, and never into the vault itself.
- An erased scope's copies go with it (`unpublish_scope`): CORE.md is memory, and a new
  session of the scope would otherwise start with the erased one's in its prompt.
"""

from __future__ import annotations

from activities.vault.context import scope_vaults
from activities.vault.files import read_text
from activities.workspace import SHARED_SCOPE, WorkspaceStore
from schemas.config import KeelSettings
from schemas.vault.schema import CORE_FILE, SCHEMA_FILE
from schemas.vault.scope import check_scope

PUBLISHED = (CORE_FILE, SCHEMA_FILE)
# Never the vault folder itself: the local store's shared area is the data folder.
PREFIX = "vault-copies/"


def shared_path(scope: str, name: str) -> str:
    """Where the published copy of a scope's vault file lies in the shared scope."""
    return f"{PREFIX}{check_scope(scope)}/{name}"


async def publish_vault_files(settings: KeelSettings, store: WorkspaceStore) -> list[str]:
    """Copy each memory scope's CORE.md and schema.json from its vault into the store when
    they changed; returns `scope/name` of each file written."""
    changed = []
    for scope, root in scope_vaults(settings.memory).items():
        for name in PUBLISHED:
            path = root / name
            if not path.is_file():
                continue
            data = read_text(path).text.encode()
            shared = await store.read(SHARED_SCOPE, shared_path(scope, name))
            # Looked at again after the read: an erasure meanwhile takes the copies once
            # the folder is gone, so none is written back after it.
            if (shared is None or shared.data != data) and path.is_file():
                await store.write(SHARED_SCOPE, shared_path(scope, name), data)
                changed.append(f"{scope}/{name}")
    return changed


async def unpublish_scope(store: WorkspaceStore, scope: str) -> int:
    """The scope's published copies, and their versions, out of the store; how many."""
    return await store.remove(SHARED_SCOPE, f"{PREFIX}{check_scope(scope)}/")


async def shared_vault_text(store: WorkspaceStore, scope: str, name: str) -> str | None:
    """The published copy of one scope's vault file, None before the vault worker
    published it. Only that scope's copy is ever read."""
    found = await store.read(SHARED_SCOPE, shared_path(scope, name))
    return found.data.decode("utf-8", errors="replace") if found else None
