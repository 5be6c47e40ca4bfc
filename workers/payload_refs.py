"""What a Keel worker does with a payload kept in external storage: a service tool's large
result it reads as a small pointer, any other reference as an unresolved payload.

Invariants:
- Keel writes nothing to external storage: its payloads are small by design (activities
  take ids and seqs), and its client refuses an input over the payload limit before
  sending it (`schemas.text.payload_problem`). So every reader of Keel's own histories
  (replay, the CLI, the UI, `keel.client`) sees plain payloads only, and pointers.
- A service tool's result of any size (a payload up to
  `activities.results.MAX_PAYLOAD_BYTES`) travels by reference: the service's worker, with
  `service_converter(settings)` on its client, keeps every activity result over
  `RESULT_BY_REFERENCE_BYTES` in Keel's store (`ResultStorage`,
  `activities.results.write_payload`), and the history holds a reference of driver
  `RESULT_DRIVER`. A Keel worker reads that reference as the small pointer
  `{"keel_result_ref": {...}}` (`ResultPointers`; `schemas.agent.result_ref`), which the
  workflow carries to the record activity; that activity reads the payload, keeps the
  result whole and records it cut to its cap. No payload over the limit is ever sent, and
  the workflow never holds the result. A service in another SDK does the same by writing
  the serialized payload at `payloads/<sha256>.bin` of the store's scope `_tool_results`
  and a reference of that driver name with the same claim (`scope`, `path`, `sha256`,
  `size`).
- A payload reference written by another client's external storage (a driver this worker
  does not have) would fail every attempt of the workflow task that carries it
  ([TMPRL1105] without storage, "No driver found" with it): a signal in the history would
  stop the session for good. Here it decodes to a small payload with the encoding
  `UNRESOLVED_ENCODING` instead, which no converter reads: an Update carrying one is
  rejected (its argument does not decode), a signal carrying one is recorded as a
  malformed input (`workflows.session` reads signals as json/plain only). A replay decodes
  it the same way, so it stays deterministic.
- Why not external storage for over-limit payloads themselves: an Update's acceptance and
  rejection echo the request as the server delivered it, built by sdk-core after the data
  converter has run, so no worker-side setting reaches it (tests/session/
  test_large_payloads.py shows it); only the sender can keep a large payload out of the
  request.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    DataConverter,
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverSelectContext,
    StorageDriverStoreContext,
)

from activities.results import MAX_PAYLOAD_BYTES, read_payload, write_payload
from schemas.agent import RESULT_REF_KEY

if TYPE_CHECKING:
    from activities.workspace import WorkspaceStore
    from schemas.config import KeelSettings

RESULT_DRIVER = "keel-results"
# A service tool's result larger than this travels by reference (the converter's own
# default threshold).
RESULT_BY_REFERENCE_BYTES = 256 * 1024

UNRESOLVED_ENCODING = b"keel/unresolved-reference"


class UnreadableStorage(StorageDriver):
    """Answers every claim with a payload saying it could not be read; stores nothing."""

    def name(self) -> str:
        return "keel-unreadable"

    async def store(self, context: StorageDriverStoreContext,
                    payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        raise RuntimeError("Keel keeps no payload in external storage")  # never selected

    async def retrieve(self, context: StorageDriverRetrieveContext,
                       claims: Sequence[StorageDriverClaim]) -> list[Payload]:
        return [Payload(metadata={"encoding": UNRESOLVED_ENCODING},
                        data=json.dumps(dict(c.claim_data), sort_keys=True).encode())
                for c in claims]


class ResultPointers(StorageDriver):
    """A Keel worker's reading of a service tool's result kept by reference: the small
    pointer the workflow carries, never the result itself; stores nothing."""

    def name(self) -> str:
        return RESULT_DRIVER

    async def store(self, context: StorageDriverStoreContext,
                    payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        raise RuntimeError("Keel keeps no payload in external storage")  # never selected

    async def retrieve(self, context: StorageDriverRetrieveContext,
                       claims: Sequence[StorageDriverClaim]) -> list[Payload]:
        return [Payload(metadata={"encoding": b"json/plain"},
                        data=json.dumps({RESULT_REF_KEY: dict(c.claim_data)},
                                        sort_keys=True).encode())
                for c in claims]


class ResultStorage(StorageDriver):
    """The service's side: an activity's result kept in Keel's store
    (activities.results)."""

    def __init__(self, store: WorkspaceStore) -> None:
        self._store = store

    def name(self) -> str:
        return RESULT_DRIVER

    async def store(self, context: StorageDriverStoreContext,
                    payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        return [StorageDriverClaim(claim_data=await write_payload(self._store, p))
                for p in payloads]

    async def retrieve(self, context: StorageDriverRetrieveContext,
                       claims: Sequence[StorageDriverClaim]) -> list[Payload]:
        return [await read_payload(self._store, dict(c.claim_data)) for c in claims]


@dataclasses.dataclass(frozen=True)
class ForeignReferences(ExternalStorage):
    """External storage that writes nothing and reads a service tool's result as a
    pointer, and every other reference, whatever driver wrote it, as an unresolved
    payload."""

    def _get_driver_by_name(self, name: str) -> StorageDriver:
        return next((d for d in self.drivers if d.name() == name), self.drivers[0])


def never_stores(converter: DataConverter) -> bool:
    """Whether `converter` keeps no payload in external storage (a Keel worker's reads
    references only), so no store context could change what it writes."""
    return converter.external_storage is None or isinstance(converter.external_storage,
                                                            ForeignReferences)


def foreign_references() -> ForeignReferences:
    return ForeignReferences(drivers=[UnreadableStorage(), ResultPointers()],
                             driver_selector=lambda context, payload: None)


def service_converter(settings: KeelSettings,
                      converter: DataConverter = pydantic_data_converter) -> DataConverter:
    """The converter for the client of a service's worker that serves Keel's tools: every
    activity result over RESULT_BY_REFERENCE_BYTES is kept in the store `settings` name
    (the Keel workers' own: the same database, or the same data folder) and travels by
    reference. Only activity results: a workflow this client starts, a signal it sends,
    carry their payloads as before."""
    from activities.workspace import open_store

    limits = {"max_file_bytes": MAX_PAYLOAD_BYTES, "max_workspace_bytes": 2**62}
    driver = ResultStorage(open_store(settings.model_copy(update=limits)))

    def activity_results(context: StorageDriverSelectContext,
                         payload: Payload) -> StorageDriver | None:
        return driver if activity.in_activity() else None

    return dataclasses.replace(converter, external_storage=ExternalStorage(
        drivers=[driver], driver_selector=activity_results,
        payload_size_threshold=RESULT_BY_REFERENCE_BYTES))


def worker_converter(converter: DataConverter) -> DataConverter:
    """`converter` reading foreign payload references as unresolved payloads."""
    return dataclasses.replace(converter, external_storage=foreign_references())


def worker_client(client: Client) -> Client:
    """The same connection and settings as `client`, with the worker's converter."""
    config = client.config()
    if isinstance(config["data_converter"].external_storage, ForeignReferences):
        return client
    config["data_converter"] = worker_converter(config["data_converter"])
    return Client(**config)

