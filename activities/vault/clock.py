"""The server's clock zone, read from the environment and /etc (the one vault module that
reads the host's time-zone files).

A vault without a configured zone (`MemorySettings.timezone` None) runs on this zone: its
daily files, rollup periods and schedules follow the server's local day.
"""

from __future__ import annotations

import os
from pathlib import Path


def local_timezone_name(env: dict[str, str] | None = None) -> str:
    """The server's IANA zone name: rollups run on server-local time unless configured."""
    e = os.environ if env is None else env
    if e.get("TZ", "").strip(":"):
        return e["TZ"].strip(":")
    try:
        target = os.readlink("/etc/localtime")
        marker = "zoneinfo/"
        if marker in target:
            return target.split(marker, 1)[1]
    except OSError:
        pass
    try:
        name = Path("/etc/timezone").read_text().strip()
        if name:
            return name
    except OSError:
        pass
    return "UTC"
