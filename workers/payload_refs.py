"""What a Keel worker does with a payload kept in external storage it cannot read.

Invariants:
- Keel writes nothing to external storage: its payloads are small by design (activities
  take ids and seqs), and its client refuses an input over the payload limit before
  sending it (`schemas.text.payload_problem`). So every reader of Keel's own histories
  (replay, the CLI, the UI, `keel.client`) sees plain payloads only.
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

from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import (
    DataConverter,
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)

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


@dataclasses.dataclass(frozen=True)
class ForeignReferences(ExternalStorage):
    """External storage that writes nothing and reads every reference, whatever driver
    wrote it, as an unresolved payload."""

    def _get_driver_by_name(self, name: str) -> StorageDriver:
        return self.drivers[0]


def foreign_references() -> ForeignReferences:
    return ForeignReferences(drivers=[UnreadableStorage()],
                             driver_selector=lambda context, payload: None)


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
