"""`keel.client` stays a light, typed face: it imports no workflow, activity, database or
model code, and every refusal arrives as its own exception, mapped by type.

The mapping is checked against the real dev server, including which exception Temporal
itself raises in each case (the `__cause__` of Keel's exception), so a change in the SDK
or server shows here rather than as a misreported error in a service.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

import keel.client
from keel._errors import from_update_failure
from keel.client import (
    KeelClient,
    MessageRejectedError,
    NoSuchInputError,
    NoTemporalAddressError,
    RecordFailedError,
    SessionExistsError,
    SessionNotFoundError,
    SessionOverrides,
    SessionStoppedError,
    session_config,
)
from schemas.config import KeelSettings
from schemas.session import Rejection, SessionConfig
from tests.checkpoint_model import CheckpointModel
from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings, start_flooded
from workflows.turn import TOO_LONG_MESSAGE


@pytest.fixture
def settings(database_url, tmp_path):
    return make_settings(database_url, tmp_path)  # offline model


def test_importing_the_client_loads_no_heavy_code():
    # The one connection helper lives with the workers (workers/connect.py: temporalio and
    # the settings only); nothing else of workers/ may come with the client.
    probe = (
        "import sys, keel.client\n"
        "heavy = {'psycopg', 'psycopg_pool', 'anthropic', 'tiktoken', 'activities',"
        " 'workflows', 'workers', 'keel.devstack', 'cryptography'}\n"
        "light = {'workers', 'workers.connect'}\n"
        "loaded = {m for m in sys.modules if (m in heavy or m.split('.')[0] in heavy)"
        " and m not in light}\n"
        "assert not loaded, sorted(loaded)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    # Nor does the command line carry the bundle seal's cryptography into every command
    # (~30 ms of start-up): `keel import` and `keel seal-key` load it when they run.
    cli = ("import sys, keel.cli\n"
           "assert not [m for m in sys.modules if m.split('.')[0] == 'cryptography']\n")
    done = subprocess.run([sys.executable, "-c", cli], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


def test_public_names():
    assert set(keel.client.__all__) >= {
        "KeelClient", "SessionHandle", "session_config", "MessageRejectedError",
        "SessionStoppedError", "SessionExistsError", "SessionNotFoundError"}
    assert all(hasattr(keel.client, name) for name in keel.client.__all__)
    assert issubclass(SessionStoppedError, MessageRejectedError)


def test_session_config_takes_typed_overrides(settings: KeelSettings) -> None:
    # Every field but the one Keel sets itself: a child session's task (the delegate tool).
    assert SessionOverrides.__optional_keys__ == set(SessionConfig.model_fields) - {"delegated"}
    config = session_config(settings, context_window=8000, record_timeout_s=3)
    assert (config.context_window, config.record_timeout_s) == (8000, 3)
    assert config.max_output_tokens == settings.model.max_output_tokens
    stepped = settings.model_copy(update={"model": settings.model.model_copy(
        update={"price_step_tokens": 100_000})})
    assert session_config(stepped).price_step_tokens == 100_000
    assert session_config(stepped, price_step_tokens=None).price_step_tokens is None
    with pytest.raises(TypeError, match="context_windw"):
        session_config(settings, context_windw=8000)  # type: ignore[call-arg]


@pytest.mark.parametrize(("rejection", "raised"), [
    (Rejection.MESSAGE_REJECTED, MessageRejectedError),
    (Rejection.SESSION_STOPPED, SessionStoppedError),
    (Rejection.RECORD_FAILED, RecordFailedError),
    (Rejection.NO_SUCH_INPUT, NoSuchInputError),
    ("SomethingNew", MessageRejectedError),  # a type this client does not know yet
])
def test_each_rejection_type_has_its_exception(rejection, raised):
    failure = WorkflowUpdateFailedError(ApplicationError("no\n  good", type=rejection))
    mapped = from_update_failure(failure)
    assert type(mapped) is raised and str(mapped) == "no good"


async def test_connect_needs_an_address(client, settings):
    assert settings.temporal_address is None
    with pytest.raises(NoTemporalAddressError, match="TEMPORAL_ADDRESS"):
        await KeelClient.connect(settings)
    keel = await KeelClient.connect(settings, client.service_client.config.target_host)
    assert keel.task_queue == settings.task_queue


async def test_refusals_of_a_running_session(client, settings):
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"cl-{uuid.uuid4().hex[:8]}")

        with pytest.raises(MessageRejectedError) as refused:
            await session.send("   ")
        assert type(refused.value) is MessageRejectedError
        assert str(refused.value) == "the message is empty"  # one line, no type prefix
        cause = refused.value.__cause__
        assert isinstance(cause, WorkflowUpdateFailedError)
        assert isinstance(cause.cause, ApplicationError)
        assert cause.cause.type == Rejection.MESSAGE_REJECTED

        with pytest.raises(NoSuchInputError, match="no input #99"):
            await session.wait_reply(99)

        with pytest.raises(SessionExistsError, match="exists already") as exists:
            await keel.start_session(session.session_id)
        assert isinstance(exists.value.__cause__, WorkflowAlreadyStartedError)

        # A running session takes the first message of update-with-start as any other.
        again, accepted = await keel.start_with_message(session.session_id, "Hello")
        assert again.session_id == session.session_id and accepted.seq == 1
        with pytest.raises(MessageRejectedError, match="empty"):
            await keel.start_with_message(session.session_id, "")
        await session.wait_reply(accepted.seq)


async def test_refusals_of_an_ended_session(client, settings):
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"cl-{uuid.uuid4().hex[:8]}")
        await session.ask("Hello")
        await session.handle.terminate("test: the session ends")

        with pytest.raises(SessionStoppedError, match="has stopped: terminated") as stopped:
            await session.send("are you there?")
        cause = stopped.value.__cause__
        assert isinstance(cause, RPCError) and cause.status == RPCStatusCode.NOT_FOUND
        with pytest.raises(SessionStoppedError):
            await session.watch("w-1", "CI", "CI is green")

        # Never a second run under an ended session's id, whichever way it is started.
        with pytest.raises(SessionExistsError) as exists:
            await keel.start_session(session.session_id)
        assert isinstance(exists.value.__cause__, WorkflowAlreadyStartedError)
        with pytest.raises(SessionStoppedError) as stopped:
            await keel.start_with_message(session.session_id, "Hello again")
        assert isinstance(stopped.value.__cause__, WorkflowAlreadyStartedError)

        assert (await session.status()).turn == 1  # an ended session still answers queries


async def test_a_session_that_stopped_itself_says_why(client, database_url, fake_anthropic,
                                                      tmp_path):
    """Grown too long (a provider whose window is smaller than the session was told, its
    first input refused as too long; checkpoints that fail): the run completes with its
    stopped reason, which the refusal carries."""
    fake_anthropic.context_window = 12_000
    fake_anthropic.responder = CheckpointModel(lambda turn: text_message("no now"))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    config = session_config(settings, context_window=12_000, max_output_tokens=512)
    async with keel_worker(client, settings) as keel:
        session = await start_flooded(keel, fake_anthropic, f"cl-{uuid.uuid4().hex[:8]}",
                                      config)
        final = await session.handle.result()
        assert final.stopped_reason == TOO_LONG_MESSAGE
        with pytest.raises(SessionStoppedError, match="grown too long") as stopped:
            await session.send("are you there?")
    assert str(stopped.value) == f"session {session.session_id!r} has stopped: {TOO_LONG_MESSAGE}"
    cause = stopped.value.__cause__
    assert isinstance(cause, RPCError) and cause.status == RPCStatusCode.NOT_FOUND


async def test_a_wait_cancelled_by_its_caller_stops(client, database_url, fake_anthropic,
                                                    tmp_path):
    """`ask` and `wait_reply` ask again when the server cuts a waiting update call off, but
    a cancel from their caller (a timeout around them, Ctrl-C) ends them: the SDK reports
    both alike."""
    import asyncio
    import threading

    release = threading.Event()

    def respond(body: dict[str, object]) -> dict[str, object]:
        release.wait(30)  # the turn is still running when the caller gives up
        return text_message("late")

    fake_anthropic.responder = respond
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    try:
        async with keel_worker(client, settings) as keel:
            session = await keel.start_session(f"cl-{uuid.uuid4().hex[:8]}")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(session.ask("slow"), 1)
            accepted = await session.send("slower")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(session.wait_reply(accepted.seq), 1)
            release.set()
            assert (await session.wait_reply(accepted.seq)).reply_text == "late"
            await session.end()
    finally:
        release.set()


async def test_an_unknown_session_is_not_found(client, settings):
    keel = KeelClient(client, settings.task_queue, settings)
    session = keel.session(f"nope-{uuid.uuid4().hex[:8]}")
    with pytest.raises(SessionNotFoundError, match="not found") as missing:
        await session.status()
    cause = missing.value.__cause__
    assert isinstance(cause, RPCError) and cause.status == RPCStatusCode.NOT_FOUND
    with pytest.raises(SessionNotFoundError):
        await session.send("hello")
    with pytest.raises(SessionNotFoundError):
        await session.task("t-1", "build", "done")


async def test_a_message_the_record_cannot_take_is_record_failed(client, database_url,
                                                                 tmp_path):
    broken = make_settings(database_url.replace("keel_test_", "gone_"), tmp_path)
    async with keel_worker(client, broken) as keel:
        session = await keel.start_session(f"cl-{uuid.uuid4().hex[:8]}",
                                           config=session_config(broken, record_timeout_s=2))
        with pytest.raises(RecordFailedError, match="could not be recorded") as failed:
            await session.send("keep this")
    assert isinstance(failed.value, MessageRejectedError)  # callers of old still catch it
    assert "\n" not in str(failed.value)


# ----- a session's workspace files through the client ---------------------------------

@pytest.mark.parametrize("store", ["local", "postgres"])
async def test_client_file_calls_and_the_model_reads_the_file(client, database_url,
                                                              fake_anthropic, tmp_path, store):
    from keel.client import FileRefusedError
    from schemas.config import WorkspaceStoreKind
    from tests.fake_anthropic import tool_use_message

    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url).model_copy(
        update={"max_file_bytes": 1_000, "max_workspace_bytes": 1_400,
                "workspace_store": WorkspaceStoreKind(store)})
    fake_anthropic.push(tool_use_message([("read_file", {"path": "notes/brief.md"})]),
                        text_message("Read the brief."))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"files-{uuid.uuid4().hex[:8]}")
        assert await session.put_file("notes/brief.md", "Ship on Friday. Ünïcode.") == 1
        assert await session.put_file("notes/brief.md", "Ship on Friday, not before.") == 2
        assert await session.put_file("raw.bin", b"\x00\xff" * 200) == 1
        found = await session.read_file("notes/brief.md")
        assert found is not None and (found.data, found.version) == (
            b"Ship on Friday, not before.", 2)
        assert (await session.read_file("raw.bin")).data == b"\x00\xff" * 200
        assert await session.read_file("nothing/here.txt") is None
        listed = [(f.path, f.size, f.version) for f in await session.list_files()]
        assert listed == [("notes/brief.md", 27, 2), ("raw.bin", 400, 1)]
        assert [f.path for f in await session.list_files("notes/")] == ["notes/brief.md"]

        # The same update id twice (a resent update) writes once.
        from schemas.files import FileVersion, PutFile
        from schemas.session import Handler
        for _ in range(2):
            again = await session.handle.execute_update(
                Handler.PUT_FILE, PutFile(path="once.txt", data=b"one"), id="put-fixed",
                result_type=FileVersion)
            assert again.version == 1
        assert (await session.read_file("once.txt")).version == 1

        # Refusals: the file tools' path rules, and the store's limits with its wording.
        with pytest.raises(FileRefusedError, match="Keel's own folder and read-only"):
            await session.put_file(".keel/mind.md", "mine now")
        with pytest.raises(FileRefusedError, match="outside the session's workspace"):
            await session.put_file("../escape.txt", "out")
        with pytest.raises(FileRefusedError, match="outside the session's workspace"):
            await session.read_file("/etc/passwd")
        events_before = len((await session.handle.fetch_history()).events)
        too_big = "'big.txt' would be 1,200 bytes; the limit is 1,000 bytes"
        with pytest.raises(FileRefusedError, match=re.escape(too_big)):
            await session.put_file("big.txt", "x" * 1_200)
        # Refused before sending: the session saw nothing.
        assert len((await session.handle.fetch_history()).events) == events_before
        with pytest.raises(FileRefusedError,
                           match="the workspace would be 1,430 bytes; the limit is 1,400"):
            await session.put_file("more.txt", "y" * 1_000)
        assert "more.txt" not in [f.path for f in await session.list_files()]

        # A plain Temporal client that skips those checks meets the session's validator.
        from schemas.files import FILE_CALL_MAX_BYTES
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await session.handle.execute_update(
                Handler.PUT_FILE, PutFile(path="huge.bin", data=b"z" * (FILE_CALL_MAX_BYTES + 1)),
                result_type=FileVersion)
        assert refused.value.cause.type == Rejection.FILE_REFUSED
        assert "huge.bin" not in [f.path for f in await session.list_files()]

        # The agent reads the file the client put, through its own file tool.
        outcome = await session.ask("Read the brief in notes/brief.md.")
        assert outcome.reply_text == "Read the brief."
    result = fake_anthropic.requests[-1]["messages"][-1]["content"][0]
    assert "Ship on Friday, not before." in str(result["content"])
