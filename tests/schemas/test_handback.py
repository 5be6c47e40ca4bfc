"""Where a sub-agent's files go in its parent's workspace, and the line its answer ends
with (schemas.handback). Pure: no server."""

from __future__ import annotations

from schemas.delegation import ANSWER_CHARS
from schemas.handback import (
    HandedBack,
    conflict_path,
    destination,
    handback_line,
    is_keels,
    with_line,
)

PARENT = "team"
CHILD = "team.researcher.toolu_01ABCDEFGHIJKLMNOPQRSTUV"


def test_a_file_comes_home_unless_the_parent_has_another_there() -> None:
    def where(shared: str | None, parent: str | None) -> str:
        return destination("r.md", "child", shared, parent, CHILD, PARENT)

    assert where(None, None) == "r.md"  # new: the parent has none
    assert where("given", "given") == "r.md"  # the parent's, as it gave it: the edit home
    assert where(None, "child") == "r.md"  # home already (a retry): the same place
    beside = "subagents/researcher-OPQRSTUV/r.md"
    assert where("given", "person's") == beside  # changed meanwhile: never overwritten
    assert where(None, "its own") == beside  # a file it never gave: never overwritten


def test_one_folder_per_call_and_keels_files_stay() -> None:
    other = "team.researcher.toolu_01ZZZZZZZZZZZZZZZZZZZZZZ"
    assert conflict_path(CHILD, PARENT, "a/b.md") != conflict_path(other, PARENT, "a/b.md")
    assert conflict_path("odd", PARENT, "x") == "subagents/sub-agent-odd/x"
    assert is_keels(".keel/results/1.json") and not is_keels("keel/notes.md")


def test_the_line_names_where_each_went_and_stays_bounded() -> None:
    files = [HandedBack("r.md", "r.md", edited=True), HandedBack("n.md", "n.md"),
             HandedBack("s.md", "subagents/researcher-OPQRSTUV/s.md"),
             HandedBack("big.bin", None, why="the workspace holds 10 MiB at most")]
    line = handback_line(files, CHILD)
    assert line.startswith("[Keel: the files it wrote are in your workspace: r.md (your "
                           "file, as it edited it), n.md, s.md (at subagents/")
    assert f"left in its workspace (session {CHILD}): big.bin (the workspace holds" in line
    assert handback_line([], CHILD) == ""
    assert handback_line([], CHILD, past=1) == (
        f"[Keel: left in its workspace (session {CHILD}): 1 more file (past the first "
        "100)]")
    many = [HandedBack(f"f{i:05}.md", f"f{i:05}.md") for i in range(10_000)]
    line = handback_line(many, CHILD)
    assert len(line) < 1_000 and line.endswith("and 9980 more]")


def test_the_line_always_arrives_within_the_answers_limit() -> None:
    line = "[Keel: the files it wrote are in your workspace: a.md]"
    long = with_line("w" * (ANSWER_CHARS * 2), line)
    assert len(long) <= ANSWER_CHARS and long.endswith("\n\n" + line)
    assert with_line("done", line) == "done\n\n" + line
    assert with_line("done", "") == "done"
    assert with_line("", line) == line
