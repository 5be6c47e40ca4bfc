"""The server's clock zone, read from the environment and /etc (the one vault module that
reads the host's time-zone files).

A vault without a configured zone (`MemorySettings.timezone` None) runs on this zone: its
daily files, rollup periods and schedules follow the server's local day.
"""

from __future__ import annotations

import os
from pathlib import Path

from schemas.vault.settings import known_timezone


def local_timezone_name(env: dict[str, str] | None = None) -> str:
    """The server's IANA zone name: rollups run on server-local time unless configured.
    A source naming no zone this host can load (TZ a POSIX rule such as "CET-1CEST" or a
    path, a broken link) is passed over for the next: every vault write asks the zone for
    its local day, and one that cannot load would fail them all."""
    e = os.environ if env is None else env
    for name in (e.get("TZ", "").strip(":"), _linked_zone(), _etc_timezone()):
        if name and known_timezone(name):
            return name
    return "UTC"


def _linked_zone() -> str:
    try:
        target = os.readlink("/etc/localtime")
    except OSError:
        return ""
    marker = "zoneinfo/"
    return target.split(marker, 1)[1] if marker in target else ""


def _etc_timezone() -> str:
    try:
        return Path("/etc/timezone").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""
