"""Settings read from the environment (schemas.config.KeelSettings.from_env). Pure."""

from __future__ import annotations

import pytest

from schemas.config import KeelSettings


@pytest.mark.parametrize(("value", "commands"), [
    (None, None),  # unset: any command (as before the setting)
    ("", None),
    ("none", ()),  # no stdio MCP server at all
    ("python, npx ,/opt/mcp/bin/server", ("python", "npx", "/opt/mcp/bin/server")),
])
def test_the_stdio_commands_and_http_hosts_a_worker_reaches(value: str | None,
                                            commands: tuple[str, ...] | None) -> None:
    env = {} if value is None else {"KEEL_MCP_STDIO_COMMANDS": value,
                                    "KEEL_MCP_HTTP_HOSTS": value}
    settings = KeelSettings.from_env(env)
    assert settings.mcp_stdio_commands == settings.mcp_http_hosts == commands


def test_a_worker_waits_for_its_servers_unless_told_not_to() -> None:
    assert KeelSettings.from_env({}).connect_wait_s == 120.0
    assert KeelSettings.from_env({"KEEL_CONNECT_WAIT_S": "0"}).connect_wait_s == 0.0
