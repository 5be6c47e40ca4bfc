"""What a session may start with (schemas.session): which ids can name a session
(`session_id_problem`), which config values it can work with (`config_bounds_problem`).
Pure: no server."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.session import (
    MAX_SESSION_ID_BYTES,
    SessionConfig,
    config_bounds_problem,
    id_clause,
    session_id_problem,
)


@pytest.mark.parametrize("sid", [
    "s1", "chat-2026-12-06", "user@example.com:42", "héllo wörld", "emoji🚀",
    "family👨\u200d👩\u200d👧", "a.b.c", "x" * MAX_SESSION_ID_BYTES, "ü" * 500,
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
    ("x" * (MAX_SESSION_ID_BYTES + 1), "1001 bytes in UTF-8; the limit is 1000"),
    ("ü" * 501, "1002 bytes"),
])
def test_ids_that_cannot_name_a_session_are_refused_saying_why(sid: str, says: str) -> None:
    problem = session_id_problem(sid)
    assert problem is not None and says in problem, problem


@given(st.text(max_size=600))
def test_a_taken_id_is_one_path_part_and_leaves_vault_markers_whole(sid: str) -> None:
    if session_id_problem(sid) is not None:
        return
    assert sid not in ("", ".", "..") and "/" not in sid and "\x00" not in sid
    assert len(sid.encode("utf-8")) <= 1_000 and not sid.startswith("_")
    assert "-->" not in f"<!-- keel:{sid}:1"


def test_the_default_config_and_a_service_s_usual_ones_start() -> None:
    assert config_bounds_problem(SessionConfig()) is None
    assert config_bounds_problem(SessionConfig(
        model="claude-haiku-4-5", context_window=1_000_000, max_output_tokens=64_000,
        user_name="Ada Lovelace", record_timeout_s=5, max_tool_rounds_per_turn=200)) is None


@pytest.mark.parametrize(("fields", "says"), [
    ({"max_output_tokens": 0}, "config.max_output_tokens is 0; it may be from 1 to"),
    ({"max_output_tokens": -5}, "config.max_output_tokens is -5"),
    ({"context_window": 0}, "config.context_window is 0"),
    ({"record_timeout_s": 0}, "config.record_timeout_s is 0"),  # never recorded in time
    ({"max_tool_rounds_per_turn": 0}, "config.max_tool_rounds_per_turn is 0"),
    ({"max_message_chars": 0}, "config.max_message_chars is 0"),  # every message refused
    ({"continue_as_new_after_events": -1}, "config.continue_as_new_after_events is -1"),
    ({"price_step_tokens": 0}, "config.price_step_tokens is 0"),
    ({"model": ""}, "config.model has 0 characters"),
    ({"model": "m" * 300}, "config.model has 300 characters"),
    ({"user_name": " "}, "config.user_name has 1 characters"),
    ({"user_name": "Ada\nLovelace"}, "control characters"),
    # The name put before a user's message that looks like a source line: not one itself.
    ({"user_name": '[Harness: Task t1 "deploy"]'}, "reads as a source line"),
    ({"user_name": "\uff3bHarness: Watch w"}, "reads as a source line"),  # a lookalike [
])
def test_values_a_session_cannot_work_with_are_refused_naming_the_field(
        fields: dict[str, object], says: str) -> None:
    problem = config_bounds_problem(SessionConfig.model_validate(fields))
    assert problem is not None and says in problem, problem


def _literal(clause: str) -> str:
    """The string a visibility clause's single-quoted literal stands for; fails on a quote
    that would end it early."""
    body, out, i = clause[clause.index("'") + 1:-1], [], 0
    assert clause.endswith("'")
    while i < len(body):
        if body[i] == "\\":
            out.append(body[i + 1])
            i += 2
            continue
        assert body[i] != "'", f"an unescaped quote ends the literal early: {clause}"
        out.append(body[i])
        i += 1
    return "".join(out)


@given(st.text(min_size=1, max_size=60).filter(lambda s: session_id_problem(s) is None),
       st.booleans())
def test_an_id_clause_lists_a_superset_the_caller_narrows(sid: str, starts_with: bool) -> None:
    clause = id_clause("WorkflowId", sid, starts_with=starts_with)
    asked = _literal(clause)
    assert sid.startswith(asked)  # every record it must find is listed
    assert '"' not in asked  # what the dev server's visibility cannot find, never asked for
    if '"' not in sid:
        assert asked == sid
        assert clause.startswith("WorkflowId STARTS_WITH" if starts_with else "WorkflowId =")


def test_an_id_with_a_double_quote_is_asked_for_by_its_part_before_it() -> None:
    assert id_clause("WorkflowId", 'say"hi') == "WorkflowId STARTS_WITH 'say'"
    assert id_clause("ScheduleId", "it's") == "ScheduleId = 'it\\'s'"
    assert id_clause("WorkflowId", '"x') == "WorkflowId STARTS_WITH ''"


def test_a_new_agent_is_taken_and_its_mcp_tools_listed_again_only_when_its_servers_changed(
        ) -> None:
    from schemas.agent import AgentSpec
    from schemas.mcp import McpServerSpec, McpStdio
    from schemas.session import SessionConfig, SessionState

    fs = McpServerSpec(name="fs", stdio=McpStdio(command="fs-server"))
    state = SessionState(session_id="s", config=SessionConfig().with_agent(
        AgentSpec(mcp_servers=[fs])), mcp_listed=True)
    state.take_agent(AgentSpec(instructions="terse", model="m-2", mcp_servers=[fs]))
    assert state.mcp_listed and state.config.model == "m-2"
    assert state.config.agent is not None and state.config.agent.instructions == "terse"
    state.take_agent(AgentSpec(instructions="terse"))  # its server gone
    assert not state.mcp_listed
    fresh = SessionState(session_id="s", config=SessionConfig(), mcp_listed=True)
    fresh.take_agent(AgentSpec())  # none before
    assert not fresh.mcp_listed
