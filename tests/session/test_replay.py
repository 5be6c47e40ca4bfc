"""Replay every recorded history against the current workflow code.

A change to workflow logic that would make running sessions nondeterministic fails here.
A file `NAME.json` holds a session's run; `NAME@RUN.json` one of several runs of session NAME.
Re-record with `python scripts/record_histories.py` only for a deliberate, patched change.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from schemas.tokens import warm_tokenizer
from workflows.branch import ForkWorkflow
from workflows.session import SessionWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_histories_are_committed():
    assert HISTORIES, "no recorded histories under tests/session/histories"


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays(path: Path):
    warm_tokenizer()  # as a worker and `keel replay` do, whatever this process ran before
    history = WorkflowHistory.from_json(path.stem.split("@")[0], path.read_text())
    replayer = Replayer(workflows=[SessionWorkflow, ForkWorkflow],
                        data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
