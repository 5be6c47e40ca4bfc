"""Long memory's settings as part of KeelSettings: read once by from_env, derived from the
data dir when not given."""

import os
import subprocess
import sys
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from activities.vault.clock import local_timezone_name
from activities.vault.store import Vault
from schemas.config import KeelSettings
from schemas.vault.schema import SearchMode
from schemas.vault.settings import MemorySettings

ROOT = Path(__file__).resolve().parents[2]


def test_from_env_fills_memory_once_with_the_data_dir_defaults(tmp_path):
    settings = KeelSettings.from_env({"KEEL_DATA_DIR": str(tmp_path)})
    assert settings.memory.vault_dir == tmp_path.resolve() / "vault"
    assert settings.memory.timezone is None  # the server's zone, resolved where used
    assert settings.memory.search_mode == SearchMode.AUTO  # hybrid when a model is installed
    assert settings.memory.embedder is None
    assert settings.memory.git_push is True


def test_from_env_reads_the_memory_variables(tmp_path):
    settings = KeelSettings.from_env({
        "KEEL_DATA_DIR": str(tmp_path), "KEEL_VAULT_DIR": str(tmp_path / "elsewhere"),
        "KEEL_MEMORY_TZ": "Europe/Berlin", "KEEL_VAULT_PUSH": "no",
        "KEEL_ROLLUP_DAILY_CRON": "0 3 * * *", "KEEL_MEMORY_SEARCH_MODE": "hybrid"})
    memory = settings.memory
    assert memory.vault_dir == (tmp_path / "elsewhere").resolve()
    assert memory.timezone == "Europe/Berlin"
    assert memory.git_push is False
    assert memory.daily_cron == "0 3 * * *"
    assert memory.search_mode == SearchMode.HYBRID


def test_settings_built_directly_put_the_vault_under_their_data_dir():
    settings = KeelSettings(data_dir=Path("/srv/keel"))
    assert settings.memory.vault_dir == Path("/srv/keel/vault")
    vault = Vault(settings.memory.vault_dir, settings.memory)
    assert vault.tz().key == local_timezone_name()


def test_local_timezone_name_prefers_tz():
    assert local_timezone_name({"TZ": ":Asia/Tokyo"}) == "Asia/Tokyo"


def test_a_time_zone_the_server_cannot_load_is_refused_by_name(tmp_path):
    # Every vault write asks the zone for its local day: KEEL_MEMORY_TZ=Mars/Base let
    # sessions run while no transcript reached the vault, the worker logging each failure.
    for wrong in ("Mars/Base", "utc", "/etc/localtime", "../../etc/passwd", "x" * 300):
        with pytest.raises(ValueError, match=r"KEEL_MEMORY_TZ is '.*', not a time zone this"):
            KeelSettings.from_env({"KEEL_DATA_DIR": str(tmp_path), "KEEL_MEMORY_TZ": wrong})
        with pytest.raises(ValueError, match="not a time zone this server knows"):
            MemorySettings(vault_dir=tmp_path, timezone=wrong)
    assert MemorySettings(vault_dir=tmp_path, timezone="Asia/Tokyo").timezone == "Asia/Tokyo"


def test_a_host_zone_that_cannot_load_is_passed_over():
    for tz in ("Mars/Base", "/etc/localtime", "CET-1CEST"):
        name = local_timezone_name({"TZ": tz})
        assert name != tz and ZoneInfo(name)


def test_a_host_without_zone_files_still_knows_every_zone(tmp_path):
    # A slim container has no /usr/share/zoneinfo: the tzdata package is a dependency, so
    # the check that KEEL_MEMORY_TZ loads refuses no real zone there.
    probe = ("import zoneinfo; assert zoneinfo.TZPATH == (), zoneinfo.TZPATH; "
             "from schemas.config import KeelSettings; "
             "print(KeelSettings.from_env({'KEEL_MEMORY_TZ': 'Europe/Paris'}).memory.timezone)")
    env = {**os.environ, "PYTHONTZPATH": ""}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=60)
    assert (done.returncode, done.stdout) == (0, "Europe/Paris\n"), done.stderr
