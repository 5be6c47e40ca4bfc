"""A file a person sends goes into the session's long memory as its original, by date, as
the seed's vault layout has it (`attachments/`), linked from the day's transcript; it goes
with the session's memory into a bundle's importing vault and leaves with the session
when it is deleted (activities.vault.originals)."""

from __future__ import annotations

import uuid
from pathlib import Path

from schemas.config import WorkspaceStoreKind
from tests.attached import image, pdf
from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings
from tests.session.long_memory import transcribed


def originals(vault: Path) -> dict[str, bytes]:
    return {p.name.split("-", 1)[1]: p.read_bytes() for p in vault.glob("attachments/*/*")}


async def test_a_sent_file_is_kept_in_the_vault_goes_with_a_bundle_and_leaves_with_it(
        client, fake_anthropic, database_url, tmp_path):
    fake_anthropic.responder = lambda body: text_message("seen")
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url).model_copy(
        update={"workspace_store": WorkspaceStoreKind.POSTGRES})
    vault, team = tmp_path / "vault", tmp_path / "vaults" / "team-b"
    shot, spec = image(64, 48), pdf(2)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"orig-{uuid.uuid4().hex[:8]}")
        await session.ask("the broken page and its spec",
                          attachments=[("page shot.png", shot), ("spec.pdf", spec)])
        await transcribed(vault, session.session_id, 2)
        assert originals(vault) == {"page shot.png": shot, "spec.pdf": spec}
        daily = next(vault.glob("daily/*.md")).read_text()
        assert "![page shot.png](../attachments/" in daily and "%20shot.png)" in daily

        bundle = await keel.export_session(session.session_id, with_memory=True)
        moved = await keel.import_session(bundle, f"{session.session_id}-b",
                                          memory_scope="team-b")
        assert originals(team) == {"page shot.png": shot, "spec.pdf": spec}

        await session.end()
        await session.handle.result()
        await keel.delete_session(session.session_id)
        assert originals(vault) == {}
        assert originals(team) == {"page shot.png": shot, "spec.pdf": spec}  # the copy's
        await keel.session(moved.session_id).end()
