"""The vault on disk: its own git repository of plain markdown, and every write to it.

All writes go through `Vault`: cards only through `apply_facts` (ADD / SUPERSEDE / NOOP,
ledgered so a retried rollup never writes a card twice), transcripts only by appending,
and every written file is re-indexed for search at once. Nothing here deletes a file a
person may have written; a file that cannot be read is reported and left as it is.

Scopes: a `Vault` is one scope's (its own folder and git repository) and every statement it
runs carries that scope; activities reach one only through `MemoryContext.scoped(scope)`
(activities.vault.context).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from activities.disk import PARTIAL_GLOB
from activities.vault.bulk import index_bulk
from activities.vault.clock import local_timezone_name
from activities.vault.embedder import Embedder
from activities.vault.files import (
    atomic_write,
    read_text,
    remove_stale_git_locks,
    walk_notes,
)
from activities.vault.search import IndexDoc, delete_documents, index_documents, indexed_hashes
from schemas.vault.card import (
    Card,
    CardFact,
    FrontmatterError,
    apply_fact,
    card_filename,
    link_key,
    parse_card,
    wikilinks,
)
from schemas.vault.forget import refused_by_forget
from schemas.vault.rollup import split_transcript
from schemas.vault.schema import (
    CARDS_DIR,
    CORE_FILE,
    DAILY_DIR,
    GRAPH_DIR,
    LOCK_FILE,
    MOC_FILE,
    SCHEMA_FILE,
    SUMMARIES_DIR,
    CardOp,
    GitResult,
    SchemaProblem,
    VaultSchema,
    parse_schema,
)
from schemas.vault.scope import DEFAULT_SCOPE
from schemas.vault.settings import MemorySettings

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "keel" / "vault_template"
# Made even when an installed template lacks them (packagers drop empty folders).
REQUIRED_DIRS = (DAILY_DIR, "attachments", GRAPH_DIR,
                 *(f"{SUMMARIES_DIR}/{k}" for k in ("daily", "weekly", "monthly", "yearly")))
GIT_USER = ("Keel", "keel@localhost")
# Documents indexed in one statement batch by a full reindex.
REINDEX_BATCH = 500

_process_locks: dict[Path, asyncio.Lock] = {}
_ensure_lock = threading.Lock()


class VaultError(Exception):
    """A vault problem a person has to look at; the message says what and where."""


class OpOutcome(BaseModel):
    op_id: str
    op: CardOp
    path: str | None = None
    note: str = ""
    skipped: bool = False  # a previous attempt had applied it


@dataclass
class Vault:
    root: Path
    settings: MemorySettings
    scope: str = DEFAULT_SCOPE
    # The deployment's embedding model: what this vault indexes is embedded at once.
    embedder: Embedder | None = field(default=None, repr=False)
    _schema: tuple[VaultSchema | None, list[SchemaProblem]] | None = field(default=None,
                                                                           repr=False)
    _schema_stamp: tuple[int, int] | None = field(default=None, repr=False)
    _ensured: bool = field(default=False, repr=False)
    # (mtime_ns, size) of each markdown file when this process last indexed it.
    _seen: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)

    # --- layout -------------------------------------------------------------------------

    def rel(self, path: Path) -> str:
        return path.resolve().relative_to(self.root.resolve()).as_posix()

    def path(self, rel: str) -> Path:
        target = (self.root / rel).resolve()
        if not target.is_relative_to(self.root.resolve()):
            raise VaultError(f"{rel!r} is outside the vault")
        return target

    def ensured(self) -> bool:
        """Whether `ensure` has nothing to do (cheap: one stat, no lock, no thread)."""
        return self._ensured and (self.root / SCHEMA_FILE).exists()

    def ensure(self) -> list[str]:
        """Create the vault from the template when its folder is missing or empty.

        An existing folder is never overwritten; a missing template file is added.
        """
        with _ensure_lock:
            if self.ensured():
                return []
            notes = self._ensure()
            self._ensured = True
            return notes

    def _ensure(self) -> list[str]:
        notes: list[str] = []
        fresh = not self.root.exists() or not any(self.root.iterdir())
        self.root.mkdir(parents=True, exist_ok=True)
        for src in sorted(TEMPLATE_DIR.rglob("*")):
            dst = self.root / src.relative_to(TEMPLATE_DIR)
            if src.is_dir():
                dst.mkdir(parents=True, exist_ok=True)
            elif not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
                if not fresh:
                    notes.append(f"added missing {dst.relative_to(self.root).as_posix()}")
        for rel in REQUIRED_DIRS:
            (self.root / rel).mkdir(parents=True, exist_ok=True)
        if fresh:
            self._git_sync("init", "-q", "-b", "main")
            self._git_sync("config", "user.name", GIT_USER[0])
            self._git_sync("config", "user.email", GIT_USER[1])
            self._git_sync("add", "-A")
            self._git_sync("commit", "-q", "-m", "vault: initialised from the Keel template")
            notes.append(f"vault created at {self.root}")
        return notes

    def schema(self, reload: bool = False) -> tuple[VaultSchema | None, list[SchemaProblem]]:
        """schema.json, read again whenever the file changed (a person may edit it)."""
        path = self.root / SCHEMA_FILE
        try:
            st = path.stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if self._schema is None or reload or stamp != self._schema_stamp:
            self._schema_stamp = stamp
            if stamp is None:
                self._schema = (None, [SchemaProblem(where=SCHEMA_FILE, problem="missing")])
            else:
                self._schema = parse_schema(read_text(path).text)
        return self._schema

    def require_schema(self) -> VaultSchema:
        schema, problems = self.schema()
        if schema is None:
            listed = "; ".join(f"{p.where}: {p.problem}" for p in problems)
            raise VaultError(f"{self.root / SCHEMA_FILE} is not usable: {listed}")
        return schema

    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.settings.timezone or local_timezone_name())

    def local_date(self, when: datetime) -> str:
        return when.astimezone(self.tz()).date().isoformat()

    # --- locking ------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lock(self) -> AsyncIterator[None]:
        """One writer at a time, across activities of this process and other workers."""
        key = self.root.resolve()
        local = _process_locks.setdefault(key, asyncio.Lock())
        async with local:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root / LOCK_FILE, os.O_CREAT | os.O_RDWR, 0o644)
            try:
                try:  # free (the usual case): taken here, no thread needed
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # held by another worker: wait for it off the loop
                    await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def holds_nothing(self) -> bool:
        """Whether the vault's folder is missing or holds its lock file alone: a scope
        erased (activities.vault.erase) since a loop over the scopes listed it, whose lock
        made the folder again."""
        return not self.root.is_dir() or all(p.name == LOCK_FILE for p in self.root.iterdir())

    def drop_if_nothing(self) -> bool:
        """The folder gone when it `holds_nothing` (under the lock, as the erasure takes
        it); whether it was."""
        if not self.holds_nothing():
            return False
        with contextlib.suppress(OSError):
            (self.root / LOCK_FILE).unlink(missing_ok=True)
            self.root.rmdir()
        return True

    # --- files --------------------------------------------------------------------------

    def markdown_files(self, under: str = "") -> list[str]:
        """The vault's own markdown files (relative paths, in path order), all of them or
        those in the folder `under`."""
        return walk_notes(self.root, under)[0]

    def linked_files(self) -> list[str]:
        """The markdown names in the vault that are symbolic links: never read (one may
        point anywhere on the worker's host, whose text would reach the model, or back
        into the vault, a loop); the doctor names them for a person."""
        return walk_notes(self.root)[1]

    def card_files(self) -> list[str]:
        """The cards (relative paths, in path order): only their folder is walked, not the
        daily notes and rollups beside it."""
        return self.markdown_files(CARDS_DIR)

    def find_card(self, title: str) -> str | None:
        key = link_key(card_filename(title))
        for rel in self.card_files():
            if link_key(rel) == key:
                return rel
        return None

    def write(self, rel: str, text: str) -> bool:
        """Write a whole file when its text changes; False when it was already so."""
        target = self.path(rel)
        if target.exists() and target.read_bytes() == text.encode("utf-8"):
            return False
        atomic_write(target, text)
        return True

    # --- git ----------------------------------------------------------------------------

    def _git_sync(self, *args: str) -> str:
        import subprocess

        done = subprocess.run(["git", "-C", str(self.root), *args], capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            raise VaultError(f"git {' '.join(args)}: {done.stderr.strip() or done.stdout}")
        return done.stdout

    async def git(self, *args: str, timeout: float = 120) -> tuple[int, str]:
        started = time.time()
        proc = await asyncio.create_subprocess_exec(
            "git", "-C", str(self.root), *args, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            remove_stale_git_locks(self.root, since=started)  # what the killed git held
            return 124, f"git {args[0]} timed out after {timeout:.0f}s"
        return proc.returncode or 0, out.decode("utf-8", "replace").strip()

    async def git_problem(self) -> str | None:
        """Why the vault cannot be committed, or None. Never fixes it by itself: a folder
        that is not its own repository may belong to something else."""
        if not (self.root / ".git").exists():
            return (f"{self.root} is not a git repository; nothing was committed. Run "
                    f"`git init` there (or move the folder away so Keel creates a fresh "
                    f"vault from its template).")
        rc, top = await self.git("rev-parse", "--show-toplevel")
        if rc != 0:
            return f"{self.root}: git cannot read the repository: {top}"
        if Path(top).resolve() != self.root.resolve():
            return f"{self.root} is inside the repository {top}, not its own"
        return None

    async def commit(self, message: str, push: bool) -> GitResult:
        problem = await self.git_problem()
        if problem:
            return GitResult(problem=problem)
        notes = remove_stale_git_locks(self.root)
        rc, out = await self.git("add", "-A", "--", ".", f":(exclude,glob)**/{PARTIAL_GLOB}")
        if rc != 0:
            return GitResult(problem=f"git add failed: {out}", notes=notes)
        rc, status = await self.git("status", "--porcelain")
        result = GitResult(notes=notes)
        if status.strip():
            rc, out = await self.git("-c", f"user.name={GIT_USER[0]}",
                                     "-c", f"user.email={GIT_USER[1]}",
                                     "commit", "-q", "-m", message)
            if rc != 0:
                return GitResult(problem=f"git commit failed: {out}")
            result.committed = True
        _, head = await self.git("rev-parse", "--short", "HEAD")
        result.commit = head or None
        if push:
            _, remotes = await self.git("remote")
            if remotes.strip():
                rc, out = await self.git("push", "-q", timeout=300)
                if rc != 0:
                    result.push_problem = f"git push failed: {out}"
                else:
                    result.pushed = True
        return result

    # --- indexing -----------------------------------------------------------------------

    def documents_for(self, rel: str, text: str) -> list[IndexDoc]:
        """What search indexes for one vault file (a daily file: one document per entry)."""
        if rel == MOC_FILE or not rel.endswith(".md"):
            return []
        stem = rel.rsplit("/", 1)[-1][:-3]
        links = sorted({link_key(t) for t in wikilinks(text)})
        if rel.startswith(DAILY_DIR + "/"):
            return [daily_doc(rel, sid, seq, entry) for sid, seq, entry in split_transcript(text)]
        if rel.startswith(CARDS_DIR + "/"):
            schema, _ = self.schema()
            try:
                card = parse_card(text)
            except FrontmatterError:
                # Still searchable as text; the doctor reports the frontmatter.
                return [IndexDoc(path=rel, kind="card", title=stem, body=text,
                                 card_key=link_key(stem), links=links)]
            meta = card.meta
            status = meta.get("status") if isinstance(meta.get("status"), str) else None
            tier = meta.get("tier")
            penalised = bool(schema and (status in schema.superseded_statuses
                                         or tier == schema.decay.stale_tier))
            tags = meta.get("tags")
            tag_text = " ".join(str(t) for t in tags) if isinstance(tags, list) else str(
                tags or "")
            desc = meta.get("description") or ""
            body = (f"{desc}\n" if desc else "") + card.body_text()
            return [IndexDoc(path=rel, kind="card", title=card.title or stem, tags=tag_text,
                             body=body, card_key=link_key(stem),
                             card_type=str(meta.get("type") or "") or None, status=status,
                             penalised=penalised, links=links)]
        if rel.startswith(SUMMARIES_DIR + "/"):
            kind_dir = rel.split("/")[1] if rel.count("/") >= 2 else ""
            return [IndexDoc(path=rel, kind="summary", title=f"{kind_dir} summary {stem}",
                             body=_strip_frontmatter(text), links=links)]
        if rel == CORE_FILE:
            return [IndexDoc(path=rel, kind="core", title="Core", body=text, links=links)]
        return [IndexDoc(path=rel, kind="note", title=stem, body=_strip_frontmatter(text),
                         links=links)]

    async def index_file(self, conn: AsyncConnection, rel: str) -> int:
        """Bring the index in line with one file; returns how many documents changed."""
        target = self.path(rel)
        if not target.exists():
            old = await indexed_hashes(conn, rel, scope=self.scope)
            stale = [p for p in old if p == rel or p.startswith(rel + "#")]
            return await delete_documents(conn, stale, scope=self.scope)
        docs = self.documents_for(rel, read_text(target).text)
        old = await indexed_hashes(conn, rel, scope=self.scope)
        changed = await index_documents(
            conn, [d for d in docs if old.get(d.path) != d.content_hash()], scope=self.scope,
            embedder=self.embedder, known=old)
        keep = {d.path for d in docs}
        stale = [p for p in old if p not in keep and (p == rel or p.startswith(rel + "#"))]
        return changed + await delete_documents(conn, stale, scope=self.scope)

    def _stat_files(self) -> dict[str, tuple[int, int]]:
        out = {}
        for rel in self.markdown_files():
            st = (self.root / rel).stat()
            out[rel] = (st.st_mtime_ns, st.st_size)
        return out

    def file_stamp(self, rel: str) -> tuple[int, int] | None:
        """(mtime_ns, size) of a vault file, None when it does not exist."""
        try:
            st = (self.root / rel).stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def note_own_write(self, rel: str, before: tuple[int, int] | None) -> None:
        """A writer of this process changed `rel` and indexed what it wrote: when the file
        was as `refresh` last saw it (no hand edit waiting), `refresh` need not read it
        again. A hand edit still waiting keeps it due."""
        if before is not None and self._seen.get(rel) == before:
            stamp = self.file_stamp(rel)
            if stamp is not None:
                self._seen[rel] = stamp

    async def refresh(self, conn: AsyncConnection) -> int:
        """Re-index the files that changed on disk since this process last looked (hand
        edits in Obsidian included). The vault worker runs it on its beat
        (activities.vault.turn.catch_up_hand_edits), never per turn."""
        current = await asyncio.to_thread(self._stat_files)
        changed = 0
        for rel in sorted(set(current) | set(self._seen)):
            if current.get(rel) != self._seen.get(rel):
                changed += await self.index_file(conn, rel)
        self._seen = current
        return changed

    async def reindex(self, conn: AsyncConnection) -> tuple[int, int]:
        """Scan the vault: re-index files whose content changed, drop vanished ones.
        Returns (documents changed, documents removed)."""
        present: set[str] = set()
        old = await indexed_hashes(conn, scope=self.scope)
        due: list[IndexDoc] = []
        for rel in self.markdown_files():
            for doc in self.documents_for(rel, read_text(self.path(rel)).text):
                present.add(doc.path)
                if old.get(doc.path) != doc.content_hash():
                    due.append(doc)
        # One bulk load (batches of its own): a first index of a large vault builds the
        # vectors' index once at its end instead of inserting into it document by document.
        changed = await index_bulk(conn, due, scope=self.scope, embedder=self.embedder,
                                   batch=REINDEX_BATCH)
        removed = await delete_documents(conn, [p for p in old if p not in present],
                                         scope=self.scope)
        return changed, removed

    # --- cards --------------------------------------------------------------------------

    async def apply_facts(self, pool: AsyncConnectionPool, facts: list[tuple[str, CardFact]],
                          today: str) -> list[OpOutcome]:
        """Apply facts in order, each under its op id, at most once.

        The op is recorded `pending` before the card is touched and `applied` after; a
        retry skips applied ops, and re-applying a pending one is harmless because
        `apply_fact` leaves a card that already holds the fact unchanged. A fact for a card
        a person had forgotten, out of material of that day or before (`today` is the
        material's day), is refused (schemas.vault.forget).
        """
        schema = self.require_schema()
        outcomes: list[OpOutcome] = []
        async with self.lock(), pool.connection() as conn:
            forgotten: dict[str, str] = dict(await (await conn.execute(
                "SELECT card_key, forgotten_on::text FROM memory_forgotten WHERE scope = %s",
                (self.scope,))).fetchall())
            for op_id, fact in facts:
                cur = await conn.execute(
                    "SELECT state, outcome, path, note FROM vault_ops"
                    " WHERE scope = %s AND op_id = %s", (self.scope, op_id))
                row = await cur.fetchone()
                if row and row[0] == "applied":
                    outcomes.append(OpOutcome(op_id=op_id, op=CardOp(row[1]), path=row[2],
                                              note=row[3] or "", skipped=True))
                    continue
                await conn.execute(
                    "INSERT INTO vault_ops (scope, op_id, state) VALUES (%s, %s, 'pending')"
                    " ON CONFLICT (scope, op_id) DO NOTHING", (self.scope, op_id))
                on = forgotten.get(link_key(card_filename(fact.title)))
                if refused_by_forget(op_id, today, on):
                    outcome = OpOutcome(op_id=op_id, op=CardOp.NOOP, note=(
                        f"rejected: {fact.title!r} was forgotten on {on}; material of that "
                        "day or before does not write it again"))
                else:
                    outcome = self._apply_one(op_id, fact, schema, today)
                if outcome.path and outcome.op != CardOp.NOOP:
                    await self.index_file(conn, outcome.path)
                await conn.execute(
                    "UPDATE vault_ops SET state = 'applied', outcome = %s, path = %s,"
                    " note = %s, updated_at = now() WHERE scope = %s AND op_id = %s",
                    (outcome.op.value, outcome.path, outcome.note, self.scope, op_id))
                outcomes.append(outcome)
        return outcomes

    def _apply_one(self, op_id: str, fact: CardFact, schema: VaultSchema,
                   today: str) -> OpOutcome:
        card_type = schema.resolve_type(fact.type)
        if card_type is None:
            return OpOutcome(op_id=op_id, op=CardOp.NOOP,
                             note=f"rejected: unknown card type {fact.type!r}")
        rel = self.find_card(fact.title)
        card: Card | None = None
        if rel is not None:
            read = read_text(self.path(rel))
            if read.bad_sequences:
                return OpOutcome(op_id=op_id, op=CardOp.NOOP, path=rel,
                                 note=f"rejected: {rel} is not valid UTF-8; the card was left "
                                      "as it is")
            try:
                card = parse_card(read.text)
            except FrontmatterError as err:
                return OpOutcome(op_id=op_id, op=CardOp.NOOP, path=rel,
                                 note=f"rejected: {rel} has broken frontmatter ({err}); "
                                      "the card was left as it is")
        else:
            rel = f"{schema.folder_of(card_type)}/{card_filename(fact.title)}"
        applied = apply_fact(card, fact, schema, today)
        if applied.text is not None:
            self.write(rel, applied.text)
        return OpOutcome(op_id=op_id, op=applied.op, path=rel, note=applied.note)


def daily_doc(rel: str, session_id: str, seq: int, entry: str) -> IndexDoc:
    """One transcript entry as a search document (found again by session and seq)."""
    stem = rel.rsplit("/", 1)[-1][:-3]
    return IndexDoc(path=f"{rel}#{session_id}:{seq}", kind="daily",
                    title=f"{stem} {session_id}", body=entry, session_id=session_id, seq=seq)


def _strip_frontmatter(text: str) -> str:
    if text.startswith("---\n"):
        end = text.find("\n---", 4)
        if end != -1:
            return text[end + 4:].lstrip("\n")
    return text
