"""A second stack, for the tests that move a session to another deployment (bundles,
seals) or need a namespace of their own (the retention sweep): a fresh database with Keel's
tables (`other_database`) and another Temporal namespace (`other_temporal`)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.db import apply_migrations


@pytest.fixture
def other_database(pg_admin_url: str) -> str:
    name = f"keel_other_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = pg_admin_url.replace("/postgres?", f"/{name}?")
    apply_migrations(url)
    return url


@pytest.fixture
async def other_temporal(client: Client) -> AsyncIterator[Client]:
    """Another Temporal namespace: none of the first stack's workflow ids are there."""
    namespace = f"keel-other-{uuid.uuid4().hex[:6]}"
    await client.workflow_service.register_namespace(RegisterNamespaceRequest(
        namespace=namespace, workflow_execution_retention_period=Duration(seconds=24 * 3600)))
    for _ in range(50):
        try:
            other = await Client.connect(client.service_client.config.target_host,
                                         namespace=namespace,
                                         data_converter=pydantic_data_converter)
            await other.count_workflows()
            break
        except Exception:  # the namespace takes a moment to be served
            import asyncio

            await asyncio.sleep(0.2)
    yield other
