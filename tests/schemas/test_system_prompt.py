"""The system prompt's AGENTS.md files (schemas.context.agents_sections): carried whole up
to their budget (AGENTS_MD_MAX_TOKENS, and at most an eighth of the session's hard limit)
together; past it the file that crosses is cut with a line saying so and the files after
it are named, each with its size, never dropped unsaid. Every request carries the system
prompt and no checkpoint can shrink it: before, one large AGENTS.md left no room in the
window and the session stopped on its next message."""

from __future__ import annotations

from schemas.context import (
    AGENTS_MD_MAX_TOKENS,
    CORE_PROMPT_MAX_CHARS,
    SKILL_DESCRIPTION_CHARS,
    SKILLS_MAX_TOKENS,
    SkillEntry,
    SystemPromptParts,
    WorkspaceDoc,
    agents_md_budget,
    agents_sections,
    build_system_prompt,
    skills_budget,
    skills_section,
)
from schemas.tokens import count_tokens


def test_small_files_are_carried_whole_in_order() -> None:
    docs = [WorkspaceDoc(path="AGENTS.md", text="Run the tests first.\n"),
            WorkspaceDoc(path="svc/AGENTS.md", text="Billing: never touch prod.")]
    prompt = build_system_prompt(SystemPromptParts(agents_md=docs))
    assert "## AGENTS.md\nRun the tests first.\n\n## svc/AGENTS.md\nBilling: never touch" \
        in prompt


def test_the_budget_is_a_quarter_of_a_small_window() -> None:
    assert agents_md_budget(None) == agents_md_budget(190_000) == AGENTS_MD_MAX_TOKENS
    assert agents_md_budget(11_488) == 1_436


def test_past_the_budget_a_file_is_cut_and_the_next_ones_named() -> None:
    big = "- rule: check the release notes\n" * 3_000  # ~21,000 tokens
    docs = [WorkspaceDoc(path="AGENTS.md", text="Root rules."),
            WorkspaceDoc(path="vendor/AGENTS.md", text=big),
            WorkspaceDoc(path="z/AGENTS.md", text="Z rules.")]
    root, cut, named = agents_sections(docs, 5_000)
    assert root == "## AGENTS.md\nRoot rules."
    head = cut.split("\n", 1)[1].rsplit("\n[Keel:", 1)[0]
    assert big.startswith(head) and count_tokens(head) == 5_000 - count_tokens("Root rules.")
    assert cut.endswith(f"[Keel: cut at {len(head)} of {len(big.strip())} characters; read "
                        "the whole with read_file]")
    assert named == ("## z/AGENTS.md\n[Keel: not carried here (8 characters, past what the "
                     "system prompt holds of AGENTS.md files); read it with read_file]")
    prompt = build_system_prompt(SystemPromptParts(agents_md=docs, agents_md_tokens=5_000))
    assert count_tokens(prompt) < 5_000 + 600  # Keel's own part and the three headings


def test_a_skills_description_is_cut_to_the_formats_limit() -> None:
    long = SkillEntry(name="release-notes", description="Writes release notes. " * 200)
    short = SkillEntry(name="triage", description="Sorts new issues.")
    prompt = build_system_prompt(SystemPromptParts(skills=[long, short]))
    line = next(x for x in prompt.splitlines() if x.startswith("- release-notes: "))
    assert len(line) == len("- release-notes: ") + SKILL_DESCRIPTION_CHARS
    assert line.endswith("…") and "- triage: Sorts new issues." in prompt


def test_a_core_md_past_its_cap_by_a_hand_edit_is_carried_whole_until_four_caps() -> None:
    over = "# Core\n\n## Facts\n" + "- prefers tea in the morning\n" * 50  # ~1,500 chars
    prompt = build_system_prompt(SystemPromptParts(core_memory=over))
    assert over.strip() in prompt and "Keel: CORE.md" not in prompt


def test_a_pasted_core_md_is_cut_at_a_line_and_says_so() -> None:
    # 487 KB written into CORE.md by hand went whole into every request (~111,000 tokens
    # of a 200k window; a 32k session could send nothing).
    facts = [f"- fact number {i} about the user and their preferences" for i in range(8000)]
    core = "# Core\n\n## Facts\n" + "\n".join(facts)
    prompt = build_system_prompt(SystemPromptParts(core_memory=core))
    section = prompt.split("## Core memory (CORE.md)\n", 1)[1]
    head, note = section.rsplit("\n", 1)
    assert len(head) <= CORE_PROMPT_MAX_CHARS and core.startswith(head)
    assert head.endswith(facts[head.count("\n- fact") - 1])  # whole lines only
    assert note.startswith(f"[Keel: CORE.md is {len(core):,} characters, past its 1,200")
    assert count_tokens(prompt) < 2_000


def test_a_catalog_of_many_skills_stays_within_its_budget_and_names_the_rest() -> None:
    # 300 shared skills with full descriptions went whole into every request (61,500
    # tokens): a 16k session could send nothing.
    skills = [SkillEntry(name=f"skill-{i}", description="Does one careful thing. " * 40)
              for i in range(300)]
    prompt = build_system_prompt(SystemPromptParts(skills=skills))
    section = prompt.split("## Skills\n", 1)[1]
    assert count_tokens(section) <= SKILLS_MAX_TOKENS + 60
    assert "- skill-0: Does one careful thing." in section
    assert section.rstrip().endswith("load_skill takes a name]")
    shown = section.count("\n- skill-")
    named = section.rsplit("of the catalog: ", 1)[1].split("; ", 1)[0].split(", ")
    assert 0 < shown < 300 and "more not named" in section
    assert named[0] == f"skill-{shown}"  # the order kept: lines, then names, then a count
    small = skills_section(skills[:2], skills_budget(16_000))
    assert "[Keel:" not in small and small.count("\n- skill-") == 2
    assert skills_budget(16_000) == 1_000 and skills_budget(None) == SKILLS_MAX_TOKENS
