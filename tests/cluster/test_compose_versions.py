"""docker-compose.temporal.yml runs the Temporal server and UI the embedded dev server
ships (`temporal --version`), so the production-like stack and `keel dev` behave alike."""

from __future__ import annotations

import re
import subprocess

from bench.common import ROOT
from keel.devstack import temporal_cli_path


def test_compose_pins_the_dev_servers_server_and_ui():
    version = subprocess.run([temporal_cli_path(), "--version"], capture_output=True,
                             text=True, check=True).stdout
    found = re.search(r"Server (\S+), UI (\S+)\)", version)
    assert found, version
    server, ui = found.groups()
    compose = (ROOT / "docker-compose.temporal.yml").read_text()
    assert set(re.findall(r"image: temporalio/(?:server|admin-tools):(\S+)", compose)) == {
        server}
    assert re.findall(r"image: temporalio/ui:(\S+)", compose) == [ui]
    assert "healthcheck" in compose.split("temporal-ui:", 1)[1].split("\n\n", 1)[0]
