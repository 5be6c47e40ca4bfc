"""Keel's offline model: deterministic rules that answer Messages API requests with no key.

Invariant: nothing on the production path imports this package; the worker builds its
`OfflineBackend` once (into `activities.model.ModelBackends`), and tests and benchmarks use
the rules directly. `model` answers the session's and the checkpoint's requests (and hands
rollups and memory flushes to `rollup`, a session's declared tools to `tools`); every reply
says it is the offline model.
"""

from activities.offline.backend import OfflineBackend
from activities.offline.model import respond
from activities.offline.rollup import respond as respond_to_rollup

__all__ = ["OfflineBackend", "respond", "respond_to_rollup"]
