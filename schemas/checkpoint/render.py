"""What a checkpoint carries besides mind, memo and now, and the text that replaces the
earlier conversation.

The rendered checkpoint is framed as the agent's own recollection, for reference: where
it and the user's newest messages disagree, the newest messages win. Skills come back as
they read now, most recently loaded first; files are listed by path only.
"""

from __future__ import annotations

from pydantic import BaseModel

from schemas.checkpoint.budgets import CheckpointBudgets, cut_to_tokens
from schemas.checkpoint.memo import MemoAssembly
from schemas.checkpoint.request import seq_list
from schemas.messages import MessageType, RecordRow
from schemas.tokens import count_tokens
from schemas.tools import FILE_READ_TOOLS, FILE_WRITE_TOOLS


class CarriedSkill(BaseModel):
    name: str
    text: str
    loaded_seq: int
    cut: bool = False  # set by select_carried_skills when the text was cut to fit


def select_carried_skills(
    skills: list[CarriedSkill], budgets: CheckpointBudgets
) -> list[CarriedSkill]:
    """Skills to carry: most recently loaded first, each within its limit, all within theirs.

    A skill that no longer fits is left out rather than shown as a sliver; an older,
    smaller one may still fit after it.
    """
    latest: dict[str, CarriedSkill] = {}
    for s in sorted(skills, key=lambda s: s.loaded_seq, reverse=True):
        latest.setdefault(s.name, s)
    smallest_useful = max(1, budgets.skills_each // 4)
    out: list[CarriedSkill] = []
    used = 0
    for s in latest.values():
        if len(out) >= budgets.skills_max_count:
            break
        room = min(budgets.skills_each, budgets.skills_total - used)
        full = count_tokens(s.text)
        if full > room and room < smallest_useful:
            continue
        text = cut_to_tokens(s.text, room) if full > room else s.text
        out.append(s.model_copy(update={"text": text, "cut": s.cut or text != s.text}))
        used += count_tokens(text)
    return out


class RecentFiles(BaseModel):
    """Paths only, most recent first, each list within its limit."""

    modified: list[str]
    read: list[str]
    pushed_out: bool  # earlier files were pushed out of a list


def recent_files(moving: list[RecordRow], *, modified_before: list[str],
                 read_before: list[str], budgets: CheckpointBudgets) -> RecentFiles:
    """The files the part moving out modified and read, after those the previous checkpoint
    listed: a path used again moves to the front, and each list keeps its newest entries."""
    modified, read = list(modified_before), list(read_before)
    for row in moving:
        if row.type != MessageType.ASSISTANT or not isinstance(row.content, list):
            continue
        for block in row.content:
            if block.get("type") != "tool_use":
                continue
            path = (block.get("input") or {}).get("path")
            name = block.get("name")
            target = (modified if name in FILE_WRITE_TOOLS
                      else read if name in FILE_READ_TOOLS else None)
            if target is None or not isinstance(path, str):
                continue
            if path in target:
                target.remove(path)
            target.insert(0, path)
    pushed = len(modified) > budgets.files_modified or len(read) > budgets.files_read
    return RecentFiles(modified=modified[:budgets.files_modified],
                       read=read[:budgets.files_read], pushed_out=pushed)


def record_hint(session_id: str, cut_seq: int) -> str:
    """Where the full record is, and how to read the user's own messages in order."""
    return (
        f"The full record of this session ({session_id}) stays in Keel's database: messages "
        f"#1 to #{cut_seq - 1} are condensed here. Read them with the `read_record` tool "
        "(only_user=true gives the user's own messages in order), find one with "
        f"`search_record`, or run `keel record {session_id} --user`. A memo entry's number "
        "is its message number."
    )


def _skill_note(name: str) -> str:
    return f'[cut: load all of it with the load_skill tool, name "{name}"]'


def render_checkpoint(
    *,
    mind_text: str,
    memo: MemoAssembly,
    now_text: str,
    skills: list[CarriedSkill],
    files_modified: list[str],
    files_read: list[str],
    files_pushed_out: bool,
    record_hint: str,
    in_turn_user_seqs: list[int],
    user_name: str,
) -> str:
    """The text that replaces the earlier conversation: my own recollection, for reference.

    `skills` come from `select_carried_skills`; the file lists are already limited (see
    `recent_files`).
    """
    out = _head_lines(mind_text, memo, now_text, user_name)
    out += _skill_lines(skills)
    out += _file_lines(files_modified, files_read, files_pushed_out)
    out += ["", "## The full record", record_hint.strip()]
    if in_turn_user_seqs:
        out += [
            "",
            "## The current request",
            f"{user_name}'s messages of this turn ({seq_list(in_turn_user_seqs)}) follow, "
            "word for word. They are the current request: where they and this recollection "
            "disagree, they win.",
        ]
    out.append("</recollection>")
    return "\n".join(out) + "\n"


def _head_lines(mind_text: str, memo: MemoAssembly, now_text: str,
                user_name: str) -> list[str]:
    """The recollection's frame and its three parts: the mind, the user's words, the now."""
    out: list[str] = [
        "<recollection>",
        "This is my own recollection of the earlier part of this session, condensed at a "
        "checkpoint to make room. It is reference, not new instructions: where it and "
        f"{user_name}'s newest messages disagree, the newest messages win. {user_name}'s "
        "words and our agreements recorded in it still apply.",
        "",
        "## My mind",
        "<mind>",
        mind_text.strip(),
        "</mind>",
        "",
        f"## {user_name}'s own words",
    ]
    if memo.entries or memo.dropped_seqs:
        out += [
            "Copied word for word from the record; #N is the message's number there.",
            "<memo>",
            memo.render(),
            "</memo>",
        ]
    else:
        out.append("(No earlier message is kept here; the record has them all.)")
    return [*out, "", "## Now", "<now>", now_text.strip(), "</now>"]


def _skill_lines(skills: list[CarriedSkill]) -> list[str]:
    if not skills:
        return []
    out = ["", "## Skills carried", "Most recently loaded first, as they read now."]
    for s in skills:
        body = s.text.rstrip()
        if s.cut:
            body += "\n" + _skill_note(s.name)
        out += [f'<skill name="{s.name}" loaded="#{s.loaded_seq}">', body, "</skill>"]
    return out


def _file_lines(files_modified: list[str], files_read: list[str],
                files_pushed_out: bool) -> list[str]:
    if not (files_modified or files_read or files_pushed_out):
        return []
    out = ["", "## Files (paths only, most recent first)"]
    if files_modified:
        out.append("Modified: " + ", ".join(files_modified))
    if files_read:
        out.append("Read: " + ", ".join(files_read))
    if files_pushed_out:
        out.append(
            "Earlier files were pushed out of these lists; the ones that matter are in "
            "the now's references."
        )
    return out
