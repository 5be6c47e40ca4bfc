"""The system prompt's AGENTS.md files (schemas.context.agents_sections): carried whole up
to AGENTS_MD_MAX_CHARS together; past it the file that crosses is cut with a line saying
so and the files after it are named, each with its size, never dropped unsaid. Every
request carries the system prompt and no checkpoint can shrink it: before, one large
AGENTS.md left no room in the window and the session stopped on its next message."""

from __future__ import annotations

from schemas.context import (
    AGENTS_MD_MAX_CHARS,
    SystemPromptParts,
    WorkspaceDoc,
    agents_sections,
    build_system_prompt,
)


def test_small_files_are_carried_whole_in_order() -> None:
    docs = [WorkspaceDoc(path="AGENTS.md", text="Run the tests first.\n"),
            WorkspaceDoc(path="svc/AGENTS.md", text="Billing: never touch prod.")]
    prompt = build_system_prompt(SystemPromptParts(agents_md=docs))
    assert "## AGENTS.md\nRun the tests first.\n\n## svc/AGENTS.md\nBilling: never touch" \
        in prompt


def test_past_the_budget_a_file_is_cut_and_the_next_ones_named() -> None:
    big = "- rule\n" * 8_000  # 56,000 characters
    docs = [WorkspaceDoc(path="AGENTS.md", text="Root rules."),
            WorkspaceDoc(path="vendor/AGENTS.md", text=big),
            WorkspaceDoc(path="z/AGENTS.md", text="Z rules.")]
    root, cut, named = agents_sections(docs)
    assert root == "## AGENTS.md\nRoot rules."
    kept = AGENTS_MD_MAX_CHARS - len("Root rules.")
    assert cut.startswith("## vendor/AGENTS.md\n- rule\n") and cut.endswith(
        f"[Keel: cut at {kept} of {len(big.strip())} characters; read the whole with "
        "read_file]")
    assert named == ("## z/AGENTS.md\n[Keel: not carried here (8 characters, past what the "
                     "system prompt holds of AGENTS.md files); read it with read_file]")
    assert sum(len(s) for s in (root, cut, named)) < AGENTS_MD_MAX_CHARS + 500
