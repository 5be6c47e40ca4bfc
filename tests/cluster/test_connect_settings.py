"""The Temporal Cloud / TLS settings reach `Client.connect` exactly (workers.connect).

A TLS server cannot run offline, so the client is built lazily (no call is made) and its
service config is read back: what every Keel process (worker, CLI, client helper) sends.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from temporalio.service import TLSConfig

from schemas.config import KeelSettings, TemporalTLS
from workers.connect import TLSSettingsError, connect, tls_config


def _pem_pair(tmp_path):
    key, cert = tmp_path / "client.key", tmp_path / "client.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                    "/CN=keel-test", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


async def test_mtls_and_server_name_from_the_environment_reach_the_client(tmp_path):
    cert, key = _pem_pair(tmp_path)
    ca = tmp_path / "ca.pem"
    ca.write_bytes(cert.read_bytes())
    settings = KeelSettings.from_env({
        "TEMPORAL_ADDRESS": "my-ns.a1b2c.tmprl.cloud:7233", "TEMPORAL_NAMESPACE": "my-ns.a1b2c",
        "TEMPORAL_TLS_CERT": str(cert), "TEMPORAL_TLS_KEY": str(key),
        "TEMPORAL_TLS_CA": str(ca), "TEMPORAL_TLS_SERVER_NAME": "my-ns.a1b2c.tmprl.cloud",
        "KEEL_DATA_DIR": str(tmp_path)})
    client = await connect(settings, lazy=True)
    config = client.service_client.config
    assert config.target_host == "my-ns.a1b2c.tmprl.cloud:7233"
    assert client.namespace == "my-ns.a1b2c"
    assert config.tls == TLSConfig(server_root_ca_cert=ca.read_bytes(),
                                   domain="my-ns.a1b2c.tmprl.cloud",
                                   client_cert=cert.read_bytes(),
                                   client_private_key=key.read_bytes())
    assert config.api_key is None


async def test_api_key_means_tls_with_the_system_roots():
    settings = KeelSettings.from_env({"TEMPORAL_ADDRESS": "eu-west-1.aws.api.temporal.io:7233",
                                      "TEMPORAL_NAMESPACE": "prod.a1b2c",
                                      "TEMPORAL_API_KEY": "secret-key"})
    client = await connect(settings, lazy=True)
    assert client.service_client.config.tls is True
    assert client.service_client.config.api_key == "secret-key"


def test_the_client_helper_connects_through_it_without_psycopg_or_anthropic():
    code = ("import sys, inspect, keel.client as c; "
            "assert 'connect(settings, target)' in inspect.getsource(c.KeelClient.connect); "
            "bad = [m for m in ('psycopg', 'anthropic', 'psycopg_pool') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_nothing_set_is_plain_tcp_and_half_a_pair_is_refused(tmp_path):
    assert tls_config(TemporalTLS()) is False
    assert tls_config(TemporalTLS(enabled=True)) is True
    with pytest.raises(TLSSettingsError, match="both"):
        tls_config(TemporalTLS(client_cert_path=tmp_path / "c.pem"))
    with pytest.raises(TLSSettingsError, match="cannot read"):
        tls_config(TemporalTLS(client_cert_path=tmp_path / "no.pem",
                               client_key_path=tmp_path / "no.key"))
