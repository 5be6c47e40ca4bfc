"""`python -m keel.cli`: the same command line as the `keel` script."""

from keel.cli import app

app()
