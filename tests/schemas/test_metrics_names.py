"""Keel's metric list (schemas.metrics): one entry a name, each a valid Prometheus name in
Keel's namespace, each said in the operators' docs."""

from __future__ import annotations

import re

from bench.common import ROOT
from schemas.metrics import KEEL_METRICS


def test_each_metric_is_named_once_validly_and_documented() -> None:
    names = [m.name for m in KEEL_METRICS]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"keel_[a-z_]+", n) for n in names)
    assert all(m.description.endswith((".", ")")) for m in KEEL_METRICS)
    docs = (ROOT / "infra/README.md").read_text()
    assert [n for n in names if f"`{n}`" not in docs] == []
