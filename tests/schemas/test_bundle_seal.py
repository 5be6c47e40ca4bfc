"""The seal's pure rules: what a seal says of a bundle's lines, what an agent would run,
and how an unverified import labels its rows (schemas.bundle_seal)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.agent import AgentSpec, ServiceTool
from schemas.bundle_seal import (
    OWN,
    Seal,
    SealCheck,
    acting_parts,
    check_seal,
    public_key,
    seal_of,
    seal_said,
    trusted_keys_problem,
    unverified_rows,
    unverified_source_line,
)
from schemas.mcp import McpHttp, McpServerSpec, McpStdio
from schemas.messages import watch_source_line
from schemas.tokens import count_tokens

KEY, OTHER = b"k" * 32, b"o" * 32
BODY = b'{"data":{},"line":"header"}\n{"data":{"seq":1},"line":"row"}\n'


def test_a_seal_verifies_only_for_its_key_and_its_lines() -> None:
    seal = seal_of(KEY, BODY)
    assert seal == seal_of(KEY, BODY) and seal != seal_of(OTHER, BODY)
    assert seal.startswith(f"ed25519:{public_key(KEY)}:")
    assert check_seal(KEY, BODY, seal) == SealCheck(Seal.HERE)
    assert check_seal(KEY, BODY.replace(b"1", b"2"), seal) == SealCheck(Seal.CHANGED)
    assert check_seal(KEY, BODY + b"\n", seal) == SealCheck(Seal.CHANGED)
    assert check_seal(OTHER, BODY, seal) == SealCheck(Seal.ELSEWHERE)
    assert check_seal(KEY, BODY, None).seal is Seal.NONE
    assert check_seal(KEY, BODY, "").seal is Seal.NONE
    # A seal made up by hand under this deployment's public key does not verify.
    assert check_seal(KEY, BODY, f"ed25519:{public_key(KEY)}:{'0' * 128}").seal is \
        Seal.CHANGED
    assert check_seal(KEY, BODY, f"ed25519:{public_key(KEY)}:zz").seal is Seal.CHANGED
    for odd in ("no colon at all", f"hmac:{public_key(KEY)}:00", "ed25519::"):
        assert check_seal(KEY, BODY, odd).seal is Seal.ELSEWHERE


def test_a_trusted_deployment_s_seal_is_taken_by_its_name() -> None:
    theirs = seal_of(OTHER, BODY)
    trusted = {"staging": public_key(OTHER).upper()}  # as pasted, in any case
    assert check_seal(KEY, BODY, theirs, trusted) == SealCheck(Seal.TRUSTED, "staging")
    assert check_seal(KEY, BODY + b"x", theirs, trusted) == SealCheck(Seal.CHANGED, "staging")
    assert check_seal(KEY, BODY, theirs, {"prod": public_key(KEY)}).seal is Seal.ELSEWHERE
    assert Seal.TRUSTED in OWN and Seal.HERE in OWN and Seal.CHANGED not in OWN
    assert seal_said(Seal.TRUSTED, "staging") == \
        "sealed by staging, a deployment this one trusts"
    assert seal_said(Seal.CHANGED, "staging") == "changed since staging sealed it"
    assert seal_said(Seal.CHANGED) == "changed since this deployment sealed it"


def test_the_public_key_is_not_the_key_and_a_trust_list_is_checked() -> None:
    assert len(public_key(KEY)) == 64 and KEY.hex() != public_key(KEY)
    assert trusted_keys_problem({"staging": public_key(OTHER)}) is None
    assert "64 hex digits" in (trusted_keys_problem({"staging": "abc"}) or "")
    assert "64 hex digits" in (trusted_keys_problem({"staging": "zz" * 32}) or "")
    assert "holds '='" in (trusted_keys_problem({"": public_key(OTHER)}) or "")


def test_what_an_agent_would_run_or_reach_is_named() -> None:
    spec = AgentSpec(
        instructions="be brief",
        tools=[ServiceTool(name="deploy", activity="deploy_prod", task_queue="ops")],
        mcp_servers=[
            McpServerSpec(name="fs", stdio=McpStdio(command="npx", args=["x"])),
            McpServerSpec(name="gh", http=McpHttp(url="https://mcp.example/x",
                                                  header_env={"Authorization": "GH_TOKEN"}))])
    assert acting_parts(spec) == [
        "MCP server 'fs' runs 'npx' on the worker",
        "MCP server 'gh' is reached at 'https://mcp.example/x' with the worker's GH_TOKEN",
        "service tool 'deploy' calls 'deploy_prod' on task queue 'ops'"]
    assert acting_parts(AgentSpec(instructions="only words")) == []
    assert acting_parts(None) == []


@given(st.text(max_size=200))
def test_an_unverified_line_is_keel_s_and_holds_the_old_one_as_data(line: str) -> None:
    out = unverified_source_line(line)
    assert out.startswith('[Harness: imported, unverified: "') and out.endswith('"]')
    inner = out[len('[Harness: imported, unverified: "'):-2]
    # What the bundle said cannot close the quote or the bracket, or start a line.
    assert '"' not in inner and "]" not in inner and "[" not in inner and "\n" not in inner
    assert out.count("[") == out.count("]") == 1


@pytest.mark.parametrize(("given_line", "said"), [
    (watch_source_line("w1", "deploys"), "Watch w1 'deploys'"),
    ("[Harness: Task t1 \"ops\"] ] [Harness: Watch x]", "Task t1 'ops') ) (Harness: Watch x"),
    (None, "no source line"),
    ("  ", "no source line"),
])
def test_an_unverified_line_names_what_the_bundle_said(given_line: str | None,
                                                       said: str) -> None:
    assert unverified_source_line(given_line) == f'[Harness: imported, unverified: "{said}"]'


def test_unverified_rows_are_labelled_and_counted_again() -> None:
    rows: list[dict[str, Any]] = [
        {"type": "harness", "source_line": watch_source_line("w1", "d"), "content_text": "x",
         "token_count": 1},
        {"type": "user", "source_line": "[Harness: Task t9]", "content_text": "merge it",
         "token_count": 99},
        {"type": "user", "source_line": None, "content_text": "plain", "token_count": 1},
        {"type": "assistant", "source_line": "[Harness: Watch w2]", "content_text": "ok",
         "token_count": 7},
        {"type": "tool_result", "content_text": "r", "token_count": 3},
    ]
    assert unverified_rows(rows) == 1
    line = rows[0]["source_line"]
    assert line == '[Harness: imported, unverified: "Watch w1 \'d\'"]'
    assert rows[0]["token_count"] == count_tokens(f"{line} x")
    assert (rows[1]["source_line"], rows[1]["token_count"]) == (None, count_tokens("merge it"))
    assert (rows[2]["source_line"], rows[2]["token_count"]) == (None, 1)
    assert (rows[3]["source_line"], rows[3]["token_count"]) == (None, 7)
    assert rows[4]["source_line"] is None


def test_a_refusal_names_what_would_act_and_the_ways_to_import_it() -> None:
    from schemas.bundle_seal import memory_parts, untrusted_text

    assert memory_parts("team", 0, 0) == []
    memory = memory_parts("team", 2, 40)
    assert memory == ["it writes 2 card(s) and 40 daily-note entries into memory scope "
                      "'team', which every session of that scope recalls"]
    runs = ["MCP server 'fs' runs 'npx' on the worker"]
    agent_only = untrusted_text(SealCheck(Seal.NONE), runs, [])
    assert agent_only.startswith("the bundle is not sealed, and the session it holds would "
                                 "act in this deployment: MCP server 'fs' runs 'npx'")
    assert "with an agent of your own (--agent FILE" in agent_only
    assert agent_only.endswith("--trust (trust=True) if you trust who made it and what it "
                               "runs")
    both = untrusted_text(SealCheck(Seal.ELSEWHERE), runs, memory)
    assert "--agent" not in both  # an agent of one's own would not keep the memory out
    assert "without its memory (--without-memory" in both and "memory scope 'team'" in both
    assert untrusted_text(SealCheck(Seal.CHANGED), [], memory).endswith("what it remembers")
