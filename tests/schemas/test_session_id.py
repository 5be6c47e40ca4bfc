"""schemas.session.session_id_problem: which ids can name a session. Pure: no server."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.session import MAX_SESSION_ID_BYTES, session_id_problem


@pytest.mark.parametrize("sid", [
    "s1", "chat-2026-12-06", "user@example.com:42", "héllo wörld", "emoji🚀",
    "family👨\u200d👩\u200d👧", "a.b.c", "x" * MAX_SESSION_ID_BYTES, "ü" * 127,
])
def test_ids_a_service_would_use_are_taken(sid: str) -> None:
    assert session_id_problem(sid) is None


@pytest.mark.parametrize(("sid", "says"), [
    ("", "may not be empty"),
    (".", "cannot be a session id"),
    ("..", "cannot be a session id"),
    ("tenant/chat", "a slash"),
    ("a\\b", "a backslash"),
    ("_shared", "may not start with '_'"),  # the workspace every session reads
    ("_anything", "may not start with '_'"),
    ("a-->b", "'-->'"),
    ("tab\tid", "control characters"),
    ("nul\x00", "control characters"),
    ("lone\udc80", "lone surrogates"),
    ("x" * (MAX_SESSION_ID_BYTES + 1), "256 bytes in UTF-8; the limit is 255"),
    ("ü" * 128, "256 bytes"),
])
def test_ids_that_cannot_name_a_session_are_refused_saying_why(sid: str, says: str) -> None:
    problem = session_id_problem(sid)
    assert problem is not None and says in problem, problem


@given(st.text(max_size=300))
def test_a_taken_id_is_one_folder_name_and_leaves_vault_markers_whole(sid: str) -> None:
    if session_id_problem(sid) is not None:
        return
    assert sid not in ("", ".", "..") and "/" not in sid and "\x00" not in sid
    assert len(sid.encode("utf-8")) <= 255 and not sid.startswith("_")
    assert "-->" not in f"<!-- keel:{sid}:1"
