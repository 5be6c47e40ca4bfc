"""The doctor's steps: deterministic vault maintenance, no model.

Each step is its own activity so one failing step is reported and the others still run.
A step never deletes a file and never rewrites one it could not read in full: such files
are listed for a person instead.
"""

from __future__ import annotations

import asyncio
import json
from datetime import date, datetime
from typing import Any

from pydantic import BaseModel
from temporalio import activity

from activities.vault.context import MemoryContext
from activities.vault.dense import embed_pending
from activities.vault.embedder import embedder_for
from activities.vault.files import read_text
from activities.vault.store import Vault
from schemas.vault.card import (
    FrontmatterError,
    canonical_meta,
    link_key,
    parse_card,
    parse_fact_line,
    render_frontmatter,
    split_frontmatter,
    wikilinks,
)
from schemas.vault.doctor import StepResult
from schemas.vault.graph import (
    Finding,
    GraphNode,
    VaultGraph,
    build_graph,
    decay,
    dedup_scan,
    health,
    link_cleanup_scan,
    render_moc,
    supersede_scan,
)
from schemas.vault.schema import CARDS_DIR, CORE_FILE, GRAPH_DIR, MOC_FILE, VaultSchema
from schemas.vault.scope import DEFAULT_SCOPE


class DoctorStepInput(BaseModel):
    """Every step's input (it travels in Temporal histories: add fields only as optional)."""

    as_of: datetime
    scope: str = DEFAULT_SCOPE  # whose vault: given by the schedule, one scope per run


GRAPH_FILE = f"{GRAPH_DIR}/vault-graph.json"
HEALTH_FILE = f"{GRAPH_DIR}/health-history.jsonl"
SCAN_FILES = {"supersede": f"{GRAPH_DIR}/supersede-candidates.json",
              "dedup": f"{GRAPH_DIR}/dedup-candidates.json",
              "link_cleanup": f"{GRAPH_DIR}/link-cleanup.json"}


class _Scan(BaseModel):
    nodes: list[GraphNode]
    card_bodies: dict[str, str]
    card_facts: dict[str, list[tuple[str | None, str]]]
    unreadable: list[str]


def _folder_type(schema: VaultSchema, rel: str) -> str | None:
    folder = rel.rsplit("/", 1)[0]
    return next((t for t, spec in schema.types.items() if spec.folder == folder), None)


def _scan(vault: Vault) -> _Scan:
    nodes: list[GraphNode] = []
    bodies: dict[str, str] = {}
    facts: dict[str, list[tuple[str | None, str]]] = {}
    unreadable: list[str] = []
    for rel in vault.markdown_files():
        if rel == MOC_FILE:
            continue
        read = read_text(vault.path(rel))
        stem = rel.rsplit("/", 1)[-1][:-3]
        is_card = rel.startswith(CARDS_DIR + "/")
        node = GraphNode(path=rel, key=link_key(stem), title=stem, is_card=is_card,
                         links=wikilinks(read.text))
        if is_card:
            try:
                card = parse_card(read.text)
                meta = card.meta
                node.title = card.title or stem
                node.card_type = str(meta.get("type") or "") or None
                node.status = str(meta.get("status") or "") or None
                node.domain = str(meta.get("domain") or "") or None
                node.description = str(meta.get("description") or "")
                bodies[rel] = "\n".join(
                    ln for ln in (card.section("## Facts") or []) if ln.strip())
                facts[rel] = [(f.field, f.value) for _, f in card.facts()]
                # Lines a person wrote outside ## Facts that still look like facts count too.
                for heading, lines in card.sections:
                    if heading.strip() not in ("## Facts", "## History"):
                        facts[rel] += [(f.field, f.value) for f in map(parse_fact_line, lines)
                                       if f is not None]
            except FrontmatterError as err:
                unreadable.append(f"{rel}: {err}")
        nodes.append(node)
    return _Scan(nodes=nodes, card_bodies=bodies, card_facts=facts, unreadable=unreadable)


def _write_json(vault: Vault, rel: str, value: Any) -> None:
    vault.write(rel, json.dumps(value, ensure_ascii=False, indent=1, sort_keys=True) + "\n")


class DoctorActivities:
    def __init__(self, ctx: MemoryContext) -> None:
        self.ctx = ctx

    @activity.defn(name="doctor_enforce")
    async def doctor_enforce(self, inp: DoctorStepInput) -> StepResult:
        """Schema backstop: type aliases coerced, invalid statuses fixed, system fields
        backfilled, keys in canonical order. Only the frontmatter is rewritten."""
        ctx = self.ctx.scoped(inp.scope)
        vault = ctx.vault
        await asyncio.to_thread(vault.ensure)
        schema, schema_problems = vault.schema(reload=True)
        if schema is None:
            return StepResult(
                step="enforce", ok=False, alert=True,
                summary="schema.json is not usable, so no card was changed",
                details=[f"{p.where}: {p.problem}" for p in schema_problems])
        today = vault.local_date(inp.as_of)
        fixed = 0
        problems: list[str] = [  # for a person: files the doctor may not repair
            f"{rel}: a symbolic link, never read (Keel reads only the vault's own files); "
            "left as it is" for rel in await asyncio.to_thread(vault.linked_files)]
        fix_notes: list[str] = []
        async with vault.lock(), ctx.connection() as conn:
            for rel in vault.card_files():
                read = read_text(vault.path(rel))
                if read.bad_sequences:
                    problems.append(f"{rel}: not valid UTF-8 ({read.bad_sequences} bad "
                                    "sequences); left as it is")
                    continue
                try:
                    meta, body = split_frontmatter(read.text)
                except FrontmatterError as err:
                    problems.append(f"{rel}: {err}; left as it is")
                    continue
                stem = rel.rsplit("/", 1)[-1][:-3]
                new_meta, fixes, problem = canonical_meta(
                    meta or {}, schema, stem=stem, today=today,
                    folder_type=_folder_type(schema, rel))
                if problem:
                    problems.append(f"{rel}: {problem}; left as it is")
                    continue
                if meta is None and not body.lstrip().startswith("# "):
                    body = f"# {new_meta['title']}\n\n{body.lstrip()}"
                text = render_frontmatter(new_meta) + (body if meta is not None
                                                       else body.lstrip("\n"))
                if vault.write(rel, text):
                    fixed += 1
                    fix_notes.extend(f"{rel}: {f.field} {f.before!r} → {f.after!r} ({f.why})"
                                     for f in fixes)
                    await vault.index_file(conn, rel)
        summary = f"{fixed} card(s) re-canonicalised"
        if problems:
            summary += f"; {len(problems)} file(s) need a person"
        return StepResult(step="enforce", ok=True, alert=bool(problems), summary=summary,
                          details=problems, data={"fixed": fixed, "fixes": fix_notes})

    @activity.defn(name="doctor_graph")
    async def doctor_graph(self, inp: DoctorStepInput) -> StepResult:
        """Rebuild the link graph, append today's health score to its history."""
        ctx = self.ctx.scoped(inp.scope)
        vault = ctx.vault
        scan = _scan(vault)
        graph = build_graph(scan.nodes)
        h = health(graph)
        day = vault.local_date(inp.as_of)
        async with vault.lock():
            _write_json(vault, GRAPH_FILE, _graph_json(graph))
            path = vault.path(HEALTH_FILE)
            lines = read_text(path).text.splitlines() if path.exists() else []
            history = [json.loads(ln) for ln in lines if ln.strip()]
            # A re-run on the same day replaces that day's line instead of adding one.
            earlier = [e for e in history if e.get("date") != day]
            previous = earlier[-1]["score"] if earlier else None
            entry = {"date": day, **h.model_dump()}
            vault.write(HEALTH_FILE, "".join(json.dumps(e, sort_keys=True) + "\n"
                                             for e in [*earlier, entry]))
        drop = (previous - h.score) if previous is not None else 0.0
        alert = drop >= ctx.memory.health_drop_alert
        summary = f"health {h.score:.1f}" + (f" (was {previous:.1f})" if previous is not None
                                             else "")
        details = [f"{len(graph.broken)} broken link(s), {h.orphans} orphan card(s)"]
        details += scan.unreadable
        return StepResult(step="graph", summary=summary, alert=alert, details=details,
                          data={"score": h.score, "previous": previous,
                                **h.model_dump()})

    @activity.defn(name="doctor_decay")
    async def doctor_decay(self, inp: DoctorStepInput) -> StepResult:
        """Update each card's relevance tier from its age and how often it was recalled."""
        ctx = self.ctx.scoped(inp.scope)
        vault = ctx.vault
        schema = vault.require_schema()
        async with ctx.connection() as conn:
            cur = await conn.execute(
                "SELECT path, access_count, last_access FROM memory_docs"
                " WHERE scope = %s AND kind = 'card'", (vault.scope,))
            access = {p: (n, last) for p, n, last in await cur.fetchall()}
        as_of = inp.as_of.astimezone(vault.tz()).date()
        changed = 0
        tiers: dict[str, int] = {}
        async with vault.lock(), ctx.connection() as conn:
            for rel in vault.card_files():
                read = read_text(vault.path(rel))
                if read.bad_sequences:
                    continue
                try:
                    meta, body = split_frontmatter(read.text)
                except FrontmatterError:
                    continue
                card_type = schema.resolve_type(str(meta.get("type"))) if meta else None
                if not meta or card_type is None:
                    continue
                count, last = access.get(rel, (0, None))
                touched = [_as_date(meta.get("updated")), _as_date(meta.get("created"))]
                if last is not None:
                    touched.append(last.astimezone(vault.tz()).date())
                newest = max((d for d in touched if d), default=as_of)
                days = max(0, (as_of - newest).days)
                relevance, tier = decay(schema.decay, card_type, count, days,
                                        is_core=bool(meta.get("core") or meta.get("pinned")))
                tiers[tier] = tiers.get(tier, 0) + 1
                # One decimal: the file changes when the tier or the tenth does, not nightly.
                relevance = round(relevance, 1)
                if meta.get("tier") != tier or meta.get("relevance") != relevance:
                    meta["tier"], meta["relevance"] = tier, relevance
                    if vault.write(rel, render_frontmatter(meta) + body):
                        changed += 1
                        await vault.index_file(conn, rel)
        return StepResult(step="decay", summary=f"{changed} card(s) changed tier or relevance",
                          data={"tiers": tiers, "changed": changed})

    @activity.defn(name="doctor_moc")
    async def doctor_moc(self, inp: DoctorStepInput) -> StepResult:
        ctx = self.ctx.scoped(inp.scope)
        vault = ctx.vault
        schema = vault.require_schema()
        graph = build_graph(_scan(vault).nodes)
        async with vault.lock():
            written = vault.write(MOC_FILE, render_moc(graph, list(schema.types)))
        cards = sum(1 for n in graph.nodes.values() if n.is_card)
        return StepResult(step="moc", summary=f"MOC.md lists {cards} card(s)"
                          + (" (rewritten)" if written else " (unchanged)"))

    @activity.defn(name="doctor_scans")
    async def doctor_scans(self, inp: DoctorStepInput) -> StepResult:
        """Dry runs: supersede, dedup and link-cleanup candidates queued for the next
        rollup, never applied here."""
        ctx = self.ctx.scoped(inp.scope)
        vault = ctx.vault
        scan = _scan(vault)
        graph = build_graph(scan.nodes)
        found: dict[str, list[Finding]] = {
            "supersede": supersede_scan(scan.card_facts),
            "dedup": dedup_scan(graph, scan.card_bodies),
            "link_cleanup": link_cleanup_scan(graph),
        }
        async with vault.lock():
            for name, items in found.items():
                _write_json(vault, SCAN_FILES[name], [f.model_dump() for f in items])
        counts = {k: len(v) for k, v in found.items()}
        return StepResult(step="scans",
                          summary=", ".join(f"{v} {k}" for k, v in counts.items()),
                          details=[f"{f.scan}: {f.detail}" for v in found.values() for f in v],
                          data=counts)

    @activity.defn(name="doctor_core_check")
    async def doctor_core_check(self, inp: DoctorStepInput) -> StepResult:
        ctx = self.ctx.scoped(inp.scope)
        vault = ctx.vault
        path = vault.root / CORE_FILE
        size = len(read_text(path).text) if path.exists() else 0
        cap = ctx.memory.core_max_chars
        over = size > cap
        return StepResult(
            step="core", alert=over, data={"chars": size, "cap": cap},
            summary=(f"CORE.md is {size} characters, over its {cap} cap: shorten it by hand "
                     "(the doctor never cuts a person's words)") if over
            else f"CORE.md {size}/{cap} characters")

    @activity.defn(name="doctor_reindex")
    async def doctor_reindex(self, inp: DoctorStepInput) -> StepResult:
        ctx = self.ctx.scoped(inp.scope)
        async with ctx.connection() as conn:
            changed, removed = await ctx.vault.reindex(conn)
            await conn.execute("DELETE FROM memory_terms WHERE scope = %s AND df <= 0",
                               (ctx.scope,))
            embedded = 0
            embedder = embedder_for(ctx.memory)
            if embedder is not None:
                embedded = await embed_pending(conn, embedder, scope=ctx.scope)
        return StepResult(step="reindex",
                          summary=f"{changed} document(s) re-indexed, {removed} removed"
                          + (f", {embedded} embedded" if embedded else ""),
                          data={"changed": changed, "removed": removed})


def _as_date(value: Any) -> date | None:
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(str(value))
    except ValueError:
        return None


def _graph_json(graph: VaultGraph) -> dict[str, Any]:
    return {
        "nodes": [{"path": n.path, "title": n.title, "type": n.card_type, "status": n.status}
                  for n in sorted(graph.nodes.values(), key=lambda n: n.path)],
        "edges": [list(e) for e in graph.edges],
        "broken": [list(b) for b in graph.broken],
    }
