"""The pure rules of branching (schemas.branch): branch points, the checkpoint and rows a
fork takes, the state it starts from, and the bundle's lines and versions."""

from __future__ import annotations

import gzip
import json

import pytest

from schemas.branch import (
    BUNDLE_FORMAT,
    BranchCheckpoint,
    BranchError,
    BundleHeader,
    BundleVersionError,
    bundle_line,
    check_end,
    check_header,
    checkpoint_at,
    copy_plan,
    line_of,
    point_problem,
    renamed_checkpoint,
    round_problem,
    state_at,
    tool_call_ids,
    unpacked,
)
from schemas.session import SessionConfig, SessionState


def ckpt(record_seq: int, cut_seq: int, carried: list[int] | None = None) -> BranchCheckpoint:
    return BranchCheckpoint(checkpoint_id=f"ckpt:s:a{record_seq}", record_seq=record_seq,
                            cut_seq=cut_seq, carried_seqs=carried or [], mind_text="M",
                            memo_text="m", now_text="n", window_tokens_after=900)


def test_a_point_must_be_in_the_record():
    assert point_problem(0, 10) and point_problem(11, 10)
    assert point_problem(1, 10) is None and point_problem(10, 10) is None


def test_a_point_inside_a_tool_round_is_refused():
    assert round_problem(5, 4, ["t1", "t2"], ["t1"]) is not None
    assert "#4" in (round_problem(5, 4, ["t1"], []) or "")
    assert round_problem(6, 4, ["t1", "t2"], ["t2", "t1"]) is None
    assert round_problem(3, None, [], []) is None
    assert round_problem(4, 4, [], []) is None  # a plain reply


def test_tool_call_ids_read_an_assistant_rows_content():
    content = [{"type": "text", "text": "x"}, {"type": "tool_use", "id": "a", "name": "n"},
               {"type": "tool_use", "id": "b"}]
    assert tool_call_ids(content) == ["a", "b"]
    assert tool_call_ids(None) == [] and tool_call_ids({"id": "a"}) == []


def test_the_checkpoint_is_the_newest_at_or_before_the_point():
    first, second = ckpt(10, 6), ckpt(20, 15)
    assert checkpoint_at([first, second], 9) is None
    assert checkpoint_at([first, second], 10) is first
    assert checkpoint_at([first, second], 19) is first
    assert checkpoint_at([second, first], 25) is second


def test_a_fork_copies_the_window_at_the_point():
    assert copy_plan(None, 7).model_dump() == {"carried": [], "from_seq": 1, "upto": 7}
    plan = copy_plan(ckpt(20, 15, carried=[16, 3, 12]), 30)
    assert (plan.carried, plan.from_seq, plan.upto) == ([3, 12], 15, 30)


def test_the_state_points_at_the_checkpoint():
    config = SessionConfig(model="m")
    state = state_at("f", config, ckpt(20, 15), 30, turn=4, checkpoint_count=2,
                     checkpoint_attempts=3, checkpoint_id="ckpt:f:a20")
    assert (state.next_seq, state.recorded_upto, state.window_start_seq) == (31, 30, 15)
    assert (state.checkpoint_id, state.mind_text, state.context_tokens) == (
        "ckpt:f:a20", "M", 900)
    bare = state_at("f", config, None, 5, turn=1, checkpoint_count=0, checkpoint_attempts=0)
    assert (bare.window_start_seq, bare.checkpoint_id, bare.mind_text) == (1, None, "")
    # A sub-agent's branch answers no parent: it goes on as a session of its own.
    from schemas.initiative import DelegatedTask

    child = config.model_copy(update={"delegated": DelegatedTask(
        parent_session="p", call_id="c1", agent="researcher", task="look it up")})
    branch = state_at("f", child, None, 5, turn=1, checkpoint_count=0, checkpoint_attempts=0)
    assert branch.config.delegated is None and branch.config.model == "m"
    assert child.delegated is not None  # the origin's config is left as it was


def test_checkpoint_ids_are_renamed_for_the_new_session():
    assert renamed_checkpoint("ckpt:s:a3", "s", "t") == "ckpt:t:a3"
    assert renamed_checkpoint("ckpt:s:a3", "s", "s") == "ckpt:s:a3"
    assert renamed_checkpoint("other", "s", "t") == "other@t"


def header(version: object = 1) -> bytes:
    body = BundleHeader(session_id="s", state=SessionState(session_id="s")).model_dump(
        mode="json")
    body["version"] = version
    return bundle_line("header", body)


def test_a_line_is_canonical():
    assert bundle_line("row", {"b": 1, "a": "é"}) == \
        '{"data":{"a":"é","b":1},"line":"row"}\n'.encode()


def test_the_header_is_read_or_refused_with_its_version_named():
    assert check_header(header()).session_id == "s"
    assert check_header(header(2)).version == 2  # with memory lines
    with pytest.raises(BundleVersionError, match=r"version 3 is newer .* reads \(1, 2\)"):
        check_header(header(3))
    with pytest.raises(BundleVersionError, match="version 0 is not one of"):
        check_header(header(0))
    with pytest.raises(BranchError, match="not a Keel session bundle"):
        check_header(b"hello")
    other = json.dumps({"line": "header", "data": {"format": "zip"}}).encode()
    with pytest.raises(BranchError, match=BUNDLE_FORMAT):
        check_header(other)


def test_the_end_line_counts_what_came_before():
    end = bundle_line("end", {"counts": {"row": 2, "checkpoint": 0, "rewind": 0,
                                         "file": 1}})
    check_end(end, {"row": 2, "file": 1})
    with pytest.raises(BranchError, match="does not hold"):
        check_end(end, {"row": 1, "file": 1})
    with pytest.raises(BranchError, match="cut short"):
        check_end(None, {})
    with pytest.raises(BranchError, match="cut short"):
        check_end(bundle_line("row", {}), {})


def test_the_end_line_s_seal_is_read_and_left_out_for_comparing():
    from schemas.branch import unsealed

    counts = {"row": 1, "checkpoint": 0, "rewind": 0, "file": 0}
    body = bundle_line("header", {}) + bundle_line("row", {"seq": 1})
    sealed = body + bundle_line("end", {"counts": counts, "seal": "ab:cd"})
    assert check_end(sealed.splitlines()[-1], {"row": 1}).seal == "ab:cd"
    plain = body + bundle_line("end", {"counts": counts})
    assert check_end(plain.splitlines()[-1], {"row": 1}).seal is None
    assert unsealed(gzip.compress(sealed)) == unsealed(gzip.compress(plain)) == plain
    with pytest.raises(BranchError, match="cut short"):
        unsealed(gzip.compress(body))
    with pytest.raises(BranchError, match="end line is malformed"):
        check_end(bundle_line("end", {"counts": "many"}), {})


def test_a_version_2_end_counts_the_memory_lines_too():
    from schemas.branch import line_kinds

    assert line_kinds(1) == ("row", "checkpoint", "rewind", "file")
    assert line_kinds(2)[-2:] == ("card", "daily")
    end = bundle_line("end", {"counts": {"row": 2, "card": 1, "daily": 3}})
    check_end(end, {"row": 2, "card": 1, "daily": 3}, line_kinds(2))
    with pytest.raises(BranchError, match="does not hold"):
        check_end(end, {"row": 2, "card": 1}, line_kinds(2))


def test_memory_lines_keep_to_the_vaults_folders_and_follow_a_new_id():
    from schemas.bundle_memory import (
        is_session_op,
        path_problem,
        renamed_entry,
        renamed_op,
    )

    assert path_problem("card", "cards/contacts/Dana.md") is None
    assert path_problem("daily", "daily/2026-01-02.md") is None
    for kind, path in (("card", "../CORE.md"), ("card", "/etc/x.md"),
                       ("card", "daily/2026-01-02.md"), ("daily", "daily/notes.md"),
                       ("daily", "cards/a.md"), ("card", "cards//a.md")):
        assert path_problem(kind, path), (kind, path)
    entry = "#### 10:00:00 · user · s1 <!-- keel:s1:4 -->\n\nI said s1 · s1 <!-- keel:s1:"
    renamed = renamed_entry(entry, "s1", "s2")
    assert renamed.split("\n")[0] == "#### 10:00:00 · user · s2 <!-- keel:s2:4 -->"
    assert renamed.split("\n", 1)[1] == entry.split("\n", 1)[1]  # the words are kept
    assert renamed_op("flush:s1:3-9:0", "s1", "s2") == "flush:s2:3-9:0"
    assert renamed_op("tool:toolu_1", "s1", "s2") == "tool:toolu_1"
    assert is_session_op("tool:toolu_1", "s1", {"toolu_1"})
    assert not is_session_op("tool:toolu_9", "s1", {"toolu_1"})
    assert is_session_op("flush:s1:1-2:0", "s1", set())
    assert not is_session_op("flush:s10:1-2:0", "s1", set())
    assert not is_session_op("rollup:daily:2026-01-02:0", "s1", set())


@pytest.mark.parametrize("sid", ["s1", "s1:x", "s1 x", "a-b"])
def test_a_sessions_card_ops_name_it_and_no_other(sid: str) -> None:
    # A write_card call's op names its session: call ids repeat across sessions (call_0),
    # and one whose id starts with this one's (s1:x beside s1) never matches.
    from schemas.bundle_memory import card_op_id, is_session_op, owns_op, renamed_op

    others = [o for o in ("s1", "s1:x", "s1 x", "a-b", "s1:x:y") if o != sid]
    op = card_op_id(sid, "call_0")
    assert is_session_op(op, sid, {"call_0"}) and owns_op(op, sid)
    assert owns_op(f"flush:{sid}:3-9:0", sid) and owns_op(f"flush:{sid}:3-9", sid)
    for other in others:
        assert not is_session_op(card_op_id(other, "call_0"), sid, {"call_0"}), other
        assert not owns_op(card_op_id(other, "call_0"), sid), other
        assert not owns_op(f"flush:{other}:3-9:0", sid), other
    assert renamed_op(op, sid, "new") == card_op_id("new", "call_0")
    assert renamed_op(f"flush:{sid}:3-9:0", sid, "new") == "flush:new:3-9:0"
    assert not owns_op("tool:call_0", sid)  # as written before: the call's id alone


def test_a_bundle_unpacks_within_its_limit_or_is_refused_as_it_unpacks() -> None:
    lines = b"".join(bundle_line("row", {"seq": i}) for i in range(100))
    assert unpacked(gzip.compress(lines)) == lines
    assert unpacked(gzip.compress(lines[:500]) + gzip.compress(lines[500:])) == lines
    # A small file that unpacks to far more (a gzip bomb): refused past the limit, having
    # unpacked little more than the limit.
    bomb = gzip.compress(b"\0" * 50_000_000)
    assert len(bomb) < 100_000
    with pytest.raises(BranchError, match="unpacks to more than 1,000,000 bytes"):
        unpacked(bomb, limit=1_000_000)
    for broken, says in ((b"hello", "not gzip"), (gzip.compress(lines)[:-30], "not gzip"),
                         (gzip.compress(lines)[:40], "ends before")):
        with pytest.raises(BranchError, match=says):
            unpacked(broken)


def test_a_header_without_its_fields_is_refused_naming_them() -> None:
    line = json.dumps({"line": "header", "data": {"format": BUNDLE_FORMAT,
                                                  "version": 1}}).encode()
    with pytest.raises(BranchError, match="header is malformed: session_id: Field required"):
        check_header(line)


@pytest.mark.parametrize(("field", "value", "says"), [
    ("session_id", "x\x00y", "session_id: .*control characters"),  # PostgreSQL's error, once
    ("origin_session", "../up", "origin_session: "),
    ("memory_scope", "../../etc", "memory_scope: .*not a valid scope id"),
    ("user_name", "ann\x1b[2J", "user_name: .*control character"),
])
def test_a_header_s_ids_are_held_to_their_rules(field, value, says) -> None:
    body = json.loads(header())
    body["data"][field] = value
    with pytest.raises(BranchError, match=f"header is malformed: {says}"):
        check_header(json.dumps(body).encode())


def test_a_line_nested_past_what_json_reads_is_no_bundle_line() -> None:
    # json's RecursionError went through as a traceback from `keel import`.
    with pytest.raises(BranchError, match="a line that is not JSON"):
        line_of(b'{"a":' * 100_000 + b"1" + b"}" * 100_000)


def test_an_import_goes_on_with_the_wakeups_not_expired():
    from datetime import UTC, datetime, timedelta

    from schemas.branch import live_wakeups
    from schemas.initiative import Wakeup

    now = datetime(2026, 12, 6, 12, tzinfo=UTC)

    def wakeup(id_: str, expires_in_h: float) -> Wakeup:
        return Wakeup(id=id_, note="poll", created=now - timedelta(days=1),
                      expires=now + timedelta(hours=expires_in_h), every_s=60)

    state = SessionState(session_id="s", wakeups=[wakeup("w1", 1), wakeup("w2", -1),
                                                  wakeup("w3", 0)])
    assert [w.id for w in live_wakeups(state, now)] == ["w1"]
