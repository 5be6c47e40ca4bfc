"""`keel.connect`: the Temporal connection helpers under the name keel's modules and the
tests have imported them by. The code is `workers.connect` (workers open clients too, and
may not import from keel/); this module only re-exports it, and goes once nothing imports
it by this name.
"""

from __future__ import annotations

from workers.connect import TLSSettingsError, connect, tls_config

__all__ = ["TLSSettingsError", "connect", "tls_config"]
