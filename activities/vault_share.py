"""The vault files every session worker needs for its prompt and tools (CORE.md, the
vault's schema.json), shared through the workspace store.

Invariants:
- Only the vault worker reads the vault folder and publishes (`publish_vault_files`);
  session workers read the copies from the store's shared scope (`vault/...`), so every
  worker on every host builds the same system prompt and tools, and none touches the vault.
- Publishing writes only what changed, and never into the vault itself.
"""

from __future__ import annotations

from activities.vault.store import read_text
from activities.workspace import SHARED_SCOPE, WorkspaceStore
from schemas.config import KeelSettings
from schemas.vault.schema import CORE_FILE, SCHEMA_FILE

PUBLISHED = (CORE_FILE, SCHEMA_FILE)
PREFIX = "vault/"


async def publish_vault_files(settings: KeelSettings, store: WorkspaceStore) -> list[str]:
    """Copy CORE.md and schema.json from the vault into the store when they changed."""
    changed = []
    for name in PUBLISHED:
        path = settings.memory.vault_dir / name
        if not path.is_file():
            continue
        data = read_text(path).text.encode()
        shared = await store.read(SHARED_SCOPE, PREFIX + name)
        if shared is None or shared.data != data:
            await store.write(SHARED_SCOPE, PREFIX + name, data)
            changed.append(name)
    return changed


async def shared_vault_text(store: WorkspaceStore, name: str) -> str | None:
    """The published copy of a vault file, None before the vault worker published it."""
    found = await store.read(SHARED_SCOPE, PREFIX + name)
    return found.data.decode("utf-8", errors="replace") if found else None
