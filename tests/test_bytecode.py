"""workers.bytecode: with bytecode writing off, the sandbox's fresh import of a workflow
module reads the bytecode compiled once, and compiles nothing."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import pytest

import workflows.session
from workers.bytecode import precompile_workflow_modules
from workflows.session import SessionWorkflow


def _no_compile(*args: object, **kwargs: object) -> None:
    raise AssertionError("compiled from source")


def test_a_workflow_module_is_imported_from_bytecode_compiled_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    written = precompile_workflow_modules([SessionWorkflow, SessionWorkflow])
    assert [Path(w).name.split(".")[0] for w in written] == ["__init__", "session"]
    assert all("keel-pycache-" in w for w in written)
    source = workflows.session.__file__
    assert source is not None
    # Bytecode lives under the private prefix, never beside the source.
    assert importlib.util.cache_from_source(source) == written[1]
    assert not Path(source).with_name("__pycache__").joinpath(
        Path(written[1]).name).exists()
    loader = importlib.machinery.SourceFileLoader("workflows.session", source)
    monkeypatch.setattr(loader, "source_to_code", _no_compile)
    assert loader.get_code("workflows.session") is not None  # read, not compiled


def test_nothing_is_done_when_python_writes_bytecode_or_a_prefix_is_set(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    assert precompile_workflow_modules([SessionWorkflow]) == []
    assert sys.pycache_prefix is None
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path))
    assert precompile_workflow_modules([SessionWorkflow]) == []
    assert list(tmp_path.iterdir()) == []
