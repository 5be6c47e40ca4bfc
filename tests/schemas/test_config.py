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


def test_trusted_bundle_keys_are_read_and_a_wrong_one_is_named() -> None:
    from schemas.bundle_seal import public_key

    one, two = public_key(b"a" * 32), public_key(b"b" * 32)
    settings = KeelSettings.from_env({"KEEL_TRUSTED_BUNDLE_KEYS":
                                      f" staging={one.upper()} ,, laptop = {two} "})
    assert settings.trusted_bundle_keys == {"staging": one, "laptop": two}
    assert KeelSettings.from_env({}).trusted_bundle_keys == {}
    with pytest.raises(ValueError, match="'staging' is not name=key"):
        KeelSettings.from_env({"KEEL_TRUSTED_BUNDLE_KEYS": "staging"})
    with pytest.raises(ValueError, match="the key trusted as 'staging' is not a public key"):
        KeelSettings.from_env({"KEEL_TRUSTED_BUNDLE_KEYS": "staging=abc"})


@pytest.mark.parametrize(("name", "value", "said"), [
    ("KEEL_MAX_FILE_BYTES", "10MB", "KEEL_MAX_FILE_BYTES is '10MB', not a whole number"),
    ("KEEL_CONTEXT_WINDOW", "200k", "KEEL_CONTEXT_WINDOW is '200k', not a whole number"),
    ("KEEL_CONNECT_WAIT_S", "two minutes", "KEEL_CONNECT_WAIT_S is 'two minutes', not a "
                                           "number"),
    # Numbers that read but would fail every turn, or the worker's start, later.
    ("KEEL_CONTEXT_WINDOW", "-5", "KEEL_CONTEXT_WINDOW is '-5', not a whole number above 0"),
    ("KEEL_MAX_OUTPUT_TOKENS", "-1", "KEEL_MAX_OUTPUT_TOKENS is '-1', not a whole number "
                                     "above 0"),
    ("KEEL_PRICE_STEP_TOKENS", "0", "KEEL_PRICE_STEP_TOKENS is '0', not a whole number "
                                    "above 0"),
    ("KEEL_MAX_FILE_BYTES", "-1", "KEEL_MAX_FILE_BYTES is '-1', not a whole number above 0"),
    ("KEEL_MAX_MESSAGE_CHARS", "0", "KEEL_MAX_MESSAGE_CHARS is '0', not a whole number above"),
    ("KEEL_SHUTDOWN_GRACE_S", "inf", "KEEL_SHUTDOWN_GRACE_S is 'inf', not a number of "
                                     "seconds, 0 or more"),
    ("KEEL_CONNECT_WAIT_S", "-3", "KEEL_CONNECT_WAIT_S is '-3', not a number of seconds"),
    ("KEEL_FALLBACK_HOLD_S", "nan", "KEEL_FALLBACK_HOLD_S is 'nan', not a number of seconds"),
    ("KEEL_OFFLINE_TOKEN_SKEW", "-1", "KEEL_OFFLINE_TOKEN_SKEW is '-1', not a number above 0"),
    ("KEEL_OFFLINE_TOKEN_SKEW", "0", "KEEL_OFFLINE_TOKEN_SKEW is '0', not a number above 0"),
    ("KEEL_ROW_CACHE_CHARS", "-5", "KEEL_ROW_CACHE_CHARS is '-5', not a whole number, 0 or "
                                   "more"),
    # A word that is none of the setting's: named, with those it may be.
    ("KEEL_LOG_FORMAT", "xml", "KEEL_LOG_FORMAT is 'xml', not console or json"),
    ("KEEL_WORKSPACE_STORE", "s3", "KEEL_WORKSPACE_STORE is 's3', not local or postgres"),
    ("KEEL_MEMORY_SEARCH_MODE", "fast", "KEEL_MEMORY_SEARCH_MODE is 'fast', not auto, bm25 "
                                        "or hybrid"),
])
def test_a_number_the_environment_gives_wrong_is_named(name: str, value: str,
                                                       said: str) -> None:
    with pytest.raises(ValueError, match=said):
        KeelSettings.from_env({name: value})


def test_a_python_caller_s_wrong_number_is_refused_too() -> None:
    """The same rules hold for settings made in Python (`session_config`'s source)."""
    from pydantic import ValidationError

    from schemas.config import ModelSettings

    for wrong in ({"context_window": 0}, {"max_output_tokens": -1},
                  {"offline_token_skew": float("nan")}, {"fallback_hold_s": -1.0}):
        with pytest.raises(ValidationError):
            ModelSettings.model_validate(wrong)
    with pytest.raises(ValidationError):
        KeelSettings(shutdown_grace_s=float("inf"))
    assert KeelSettings(shutdown_grace_s=0).shutdown_grace_s == 0  # a test's worker
    assert KeelSettings.from_env({"KEEL_ROW_CACHE_CHARS": "0"}).row_cache_chars == 0  # none


def test_a_word_setting_is_read_in_any_case_and_defaults_when_unset() -> None:
    from schemas.config import LogFormat, WorkspaceStoreKind
    from schemas.vault.schema import SearchMode

    read = KeelSettings.from_env({"KEEL_LOG_FORMAT": "JSON", "KEEL_WORKSPACE_STORE": " Local",
                                  "KEEL_MEMORY_SEARCH_MODE": "bm25"})
    assert read.log_format is LogFormat.JSON
    assert read.workspace_store is WorkspaceStoreKind.LOCAL
    assert read.memory.search_mode is SearchMode.BM25
    unset = KeelSettings.from_env({"DATABASE_URL": "postgresql://db/keel"})
    assert unset.log_format is LogFormat.CONSOLE
    assert unset.workspace_store is WorkspaceStoreKind.POSTGRES  # the database's
    assert unset.memory.search_mode is SearchMode.AUTO


@pytest.mark.parametrize(("value", "says"), [
    ("localhost:notaport", "not host:port (port could not be cast"),  # a traceback, before
    ("[::1", "not host:port (invalid ipv6 url)"),
    ("127.0.0.1:99999", "not host:port (port out of range"),
    ("myhost", "a host without its port (Temporal's frontend listens on 7233 by default: "
               "myhost:7233)"),  # it was port 80, tried for two minutes
    ("a b:7233", "not host:port"),
])
def test_a_temporal_address_that_names_no_frontend_is_named(value: str, says: str) -> None:
    with pytest.raises(ValueError) as read:
        KeelSettings.from_env({"TEMPORAL_ADDRESS": value})
    assert str(read.value).startswith(f"TEMPORAL_ADDRESS is {value!r}, {says}")
    with pytest.raises(ValueError) as given:
        KeelSettings(temporal_address=value)
    assert says in str(given.value)


@pytest.mark.parametrize("value", ["127.0.0.1:7233", "[::1]:7233", "ns.acct.tmprl.cloud:7233",
                                   "http://127.0.0.1:7233", "https://temporal.example"])
def test_a_temporal_address_is_host_port_or_a_url(value: str) -> None:
    assert KeelSettings.from_env({"TEMPORAL_ADDRESS": f" {value} "}).temporal_address == value
