"""The `keel` console script: the command line loaded, then run.

Invariant: this module imports nothing at its top, so a Ctrl-C while the command line loads
(about a second of imports: Temporal's protobufs, the SDKs) ends as every other Ctrl-C of a
command does, one line and exit 130, not a traceback from deep inside an import.
"""

from __future__ import annotations


def main() -> None:
    try:
        from keel.cli import app
    except KeyboardInterrupt:
        import sys

        sys.stderr.write("interrupted (Ctrl-C) while the command line loaded\n")
        raise SystemExit(130) from None
    app()
