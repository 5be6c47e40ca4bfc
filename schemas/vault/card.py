"""Cards: frontmatter, fact lines, and the one rule that applies a fact (ADD / SUPERSEDE / NOOP).

A card is plain markdown that Obsidian opens as is: YAML-style frontmatter (the flat subset
Obsidian's properties use), a `# Title`, a `## Facts` list, a `## Links` list of wikilinks
and an append-only `## History` of dated old values. Text a person wrote anywhere else in
the card is kept verbatim.
"""

from __future__ import annotations

import json
import re
from datetime import date
from typing import Any

from pydantic import BaseModel, Field

from schemas.vault.schema import CardOp, Confidence, VaultSchema

Meta = dict[str, Any]

# System fields in the order the doctor writes them; other keys follow in their own order.
SYSTEM_FIELDS = ("id", "type", "title", "status", "domain", "tags", "description",
                 "confidence", "created", "updated", "tier", "relevance")
FACTS_HEADING = "## Facts"
LINKS_HEADING = "## Links"
HISTORY_HEADING = "## History"

_KEY_RE = re.compile(r"^([A-Za-z_][\w\-]*)\s*:(.*)$")
_LIST_ITEM_RE = re.compile(r"^\s+-\s*(.*)$|^-\s+(.*)$")
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_FACT_RE = re.compile(
    r"^- (?:\*\*(?P<field>[^*]+)\*\*: )?(?P<value>.*?)"
    r" \((?P<conf>EXTRACTED|INFERRED)(?:, (?P<date>\d{4}-\d{2}-\d{2}))?\)\s*$"
)
_WIKILINK_RE = re.compile(r"\[\[([^\[\]|#^]+)(?:[#^][^\[\]|]*)?(?:\|[^\[\]]*)?\]\]")
_UNSAFE_NAME = re.compile(r'[\\/:*?"<>|#^\[\]\x00-\x1f]')


class FrontmatterError(ValueError):
    """Frontmatter that cannot be read safely; the file is left exactly as it is."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"frontmatter line {line}: {problem}")
        self.line = line
        self.problem = problem


# --- frontmatter ------------------------------------------------------------------------


def _parse_scalar(raw: str) -> Any:
    text = raw.strip()
    if not text:
        return None
    if text[0] == '"':
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"bad double-quoted string {text!r}") from err
    if text[0] == "'":
        if len(text) < 2 or text[-1] != "'":
            raise ValueError(f"unclosed single-quoted string {text!r}")
        return text[1:-1].replace("''", "'")
    if text[0] == "[":
        if text[-1] != "]":
            raise ValueError(f"unclosed list {text!r}")
        inner = text[1:-1].strip()
        return [] if not inner else [_parse_scalar(p) for p in _split_inline_list(inner)]
    if text[0] in "{|>&*!%@`":
        raise ValueError(f"unsupported YAML value {text!r}")
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "~"):
        return None
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d+", text):
        return float(text)
    return text


def _split_inline_list(inner: str) -> list[str]:
    parts: list[str] = []
    buf: list[str] = []
    quote: str | None = None
    for ch in inner:
        if quote:
            buf.append(ch)
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
            buf.append(ch)
        elif ch == ",":
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
    if quote:
        raise ValueError("unclosed quote in list")
    parts.append("".join(buf))
    return [p for p in parts if p.strip()]


def split_frontmatter(text: str) -> tuple[Meta | None, str]:
    """(meta, body). No frontmatter: (None, text). Broken frontmatter raises FrontmatterError."""
    if not text.startswith("---"):
        return None, text
    lines = text.split("\n")
    if lines[0].strip() != "---":
        return None, text
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    if end is None:
        raise FrontmatterError(1, "opening --- has no closing ---")
    meta: Meta = {}
    current_list: str | None = None
    for i in range(1, end):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        item = _LIST_ITEM_RE.match(line)
        if item and current_list is not None:
            try:
                meta[current_list].append(_parse_scalar(item.group(1) or item.group(2) or ""))
            except ValueError as err:
                raise FrontmatterError(i + 1, str(err)) from err
            continue
        m = _KEY_RE.match(line)
        if not m:
            raise FrontmatterError(i + 1, f"not a 'key: value' line: {line!r}")
        key, raw = m.group(1), m.group(2)
        if key in meta:
            raise FrontmatterError(i + 1, f"key {key!r} appears twice")
        if not raw.strip():
            meta[key] = []
            current_list = key
            continue
        current_list = None
        try:
            meta[key] = _parse_scalar(raw)
        except ValueError as err:
            raise FrontmatterError(i + 1, str(err)) from err
    # An empty block list (`key:` with no items) reads as no value.
    for key, value in list(meta.items()):
        if value == [] and key not in ("tags", "aliases"):
            meta[key] = None
    body = "\n".join(lines[end + 1:])
    return meta, body


def _needs_quotes(s: str) -> bool:
    if not s or s != s.strip():
        return True
    if s[0] in "-?:,[]{}#&*!|>'\"%@`~" or ": " in s or " #" in s or s.endswith(":"):
        return True
    if s.lower() in ("true", "false", "null", "yes", "no", "on", "off"):
        return True
    return bool(re.fullmatch(r"-?\d+(\.\d+)?", s)) or "\n" in s


def _render_scalar(value: Any, in_list: bool = False) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value) if isinstance(value, float) else str(value)
    s = str(value)
    if _needs_quotes(s) or (in_list and any(c in s for c in ",[]")):
        return json.dumps(s, ensure_ascii=False)
    return s


def render_frontmatter(meta: Meta) -> str:
    lines = ["---"]
    for key, value in meta.items():
        if isinstance(value, list):
            lines.append(f"{key}: [{', '.join(_render_scalar(v, True) for v in value)}]")
        else:
            lines.append(f"{key}: {_render_scalar(value)}".rstrip())
    lines.append("---")
    return "\n".join(lines) + "\n"


# --- names and links --------------------------------------------------------------------


def card_filename(title: str) -> str:
    """The file name for a card titled `title`: Obsidian resolves [[title]] to it."""
    name = " ".join(_UNSAFE_NAME.sub(" ", title).split()).strip(". ")
    return (name[:120] or "untitled") + ".md"


def link_key(name: str) -> str:
    """How a wikilink target or a file stem is compared (Obsidian matches case-insensitively)."""
    stem = name.strip()
    if stem.lower().endswith(".md"):
        stem = stem[:-3]
    stem = stem.rsplit("/", 1)[-1]
    return " ".join(stem.split()).casefold()


def wikilinks(text: str) -> list[str]:
    """Targets of [[wikilinks]] in `text`, in order, without heading or alias parts."""
    return [m.group(1).strip() for m in _WIKILINK_RE.finditer(text)]


# --- cards ------------------------------------------------------------------------------


class FactLine(BaseModel):
    field: str | None = None
    value: str
    confidence: Confidence = Confidence.EXTRACTED
    since: str | None = None

    def render(self) -> str:
        head = f"**{self.field}**: " if self.field else ""
        tail = f"{self.confidence.value}, {self.since}" if self.since else self.confidence.value
        return f"- {head}{self.value} ({tail})"


def parse_fact_line(line: str) -> FactLine | None:
    m = _FACT_RE.match(line.rstrip())
    if not m:
        return None
    return FactLine(field=m.group("field"), value=m.group("value"),
                    confidence=Confidence(m.group("conf")), since=m.group("date"))


def normalise_value(value: str) -> str:
    """Two values are the same fact when they differ only in case, spacing or a final dot."""
    return " ".join(value.split()).rstrip(".").casefold()


class Card(BaseModel):
    """A card split into the parts the rules touch; everything else is kept as lines."""

    meta: Meta = Field(default_factory=dict)
    had_frontmatter: bool = True
    preamble: list[str] = Field(default_factory=list)  # from the title up to the first ##
    sections: list[tuple[str, list[str]]] = Field(default_factory=list)  # (heading, lines)

    def section(self, heading: str) -> list[str] | None:
        for h, lines in self.sections:
            if h.strip().casefold() == heading.casefold():
                return lines
        return None

    def ensure_section(self, heading: str) -> list[str]:
        found = self.section(heading)
        if found is not None:
            return found
        lines: list[str] = []
        order = [FACTS_HEADING, LINKS_HEADING, HISTORY_HEADING]
        # Keep the three machine sections in their usual order; History stays last.
        pos = len(self.sections)
        if heading in order:
            later = order[order.index(heading) + 1:]
            for i, (h, _) in enumerate(self.sections):
                if h.strip() in later:
                    pos = i
                    break
        self.sections.insert(pos, (heading, lines))
        return lines

    def facts(self) -> list[tuple[int, FactLine]]:
        lines = self.section(FACTS_HEADING) or []
        out = []
        for i, line in enumerate(lines):
            fact = parse_fact_line(line)
            if fact is not None:
                out.append((i, fact))
        return out

    @property
    def title(self) -> str:
        t = self.meta.get("title")
        if isinstance(t, str) and t.strip():
            return t.strip()
        for line in self.preamble:
            if line.startswith("# "):
                return line[2:].strip()
        return ""

    def body_text(self) -> str:
        out: list[str] = list(self.preamble)
        for heading, lines in self.sections:
            while out and not out[-1].strip():
                out.pop()
            if out:
                out.append("")
            out.append(heading)
            out.extend(lines)
        while out and not out[-1].strip():
            out.pop()
        return "\n".join(out) + "\n"

    def render(self) -> str:
        return render_frontmatter(self.meta) + self.body_text()


def parse_card(text: str) -> Card:
    """Read a card; raises FrontmatterError when its frontmatter is broken."""
    meta, body = split_frontmatter(text)
    lines = body.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    preamble: list[str] = []
    sections: list[tuple[str, list[str]]] = []
    current: list[str] = preamble
    for line in lines:
        if line.startswith("## "):
            current = []
            sections.append((line.rstrip(), current))
        else:
            current.append(line)
    for _, sec in sections:
        while sec and not sec[-1].strip():
            sec.pop()
    while preamble and not preamble[-1].strip():
        preamble.pop()
    return Card(meta=meta or {}, had_frontmatter=meta is not None, preamble=preamble,
                sections=sections)


# --- canonical frontmatter (the doctor's enforce and every write use this one rule) ------


class MetaFix(BaseModel):
    field: str
    before: Any = None
    after: Any = None
    why: str


def canonical_meta(meta: Meta, schema: VaultSchema, *, stem: str, today: str,
                   folder_type: str | None = None) -> tuple[Meta, list[MetaFix], str | None]:
    """The card's frontmatter made canonical: (meta, fixes, problem).

    Coerces type aliases, replaces an invalid status by the type's default, backfills system
    fields, and orders keys. `problem` is set (and the meta returned unchanged) when the type
    is unknown and the folder does not tell it: a card is never re-typed by a guess.
    """
    fixes: list[MetaFix] = []
    raw_type = meta.get("type")
    card_type = schema.resolve_type(raw_type if isinstance(raw_type, str) else None)
    if card_type is None:
        if raw_type in (None, "") and folder_type is not None:
            card_type = folder_type
            fixes.append(MetaFix(field="type", before=raw_type, after=card_type,
                                 why="missing; taken from the card's folder"))
        else:
            return meta, [], f"unknown card type {raw_type!r}"
    elif card_type != raw_type:
        fixes.append(MetaFix(field="type", before=raw_type, after=card_type,
                             why="alias coerced"))
    out: Meta = {"id": meta.get("id") or stem, "type": card_type,
                 "title": meta.get("title") or stem}
    out["status"] = _canonical_status(meta.get("status"), card_type, schema, fixes)
    out["domain"] = _canonical_domain(meta.get("domain"), schema, fixes)
    out["tags"] = _canonical_tags(meta.get("tags"), fixes)
    out["description"] = meta.get("description") or ""
    out["confidence"] = _canonical_confidence(meta.get("confidence"), fixes)
    for key in ("created", "updated"):
        value = meta.get(key)
        value = value.isoformat() if isinstance(value, date) else value
        if not (isinstance(value, str) and _DATE_RE.match(value)):
            fixes.append(MetaFix(field=key, before=meta.get(key), after=today,
                                 why="backfilled"))
            value = today
        out[key] = value
    out["tier"] = meta.get("tier") or "hot"
    relevance = meta.get("relevance")
    out["relevance"] = relevance if isinstance(relevance, int | float) else 1.0
    for key in ("id", "title"):
        if key not in meta:
            fixes.append(MetaFix(field=key, after=out[key], why="backfilled"))
    for key, value in meta.items():
        if key not in out:
            out[key] = value
    return out, fixes, None


def _canonical_status(status: Any, card_type: str, schema: VaultSchema,
                      fixes: list[MetaFix]) -> Any:
    """A valid status of the type: as written, its case fixed, or the type's default."""
    if schema.valid_status(card_type, status if isinstance(status, str) else None):
        return status
    spec = schema.types[card_type]
    fixed = None
    if isinstance(status, str):
        fixed = next((s for s in spec.statuses if s.casefold() == status.casefold()), None)
    after = fixed or spec.default_status
    fixes.append(MetaFix(field="status", before=status, after=after,
                         why="case fixed" if fixed else f"not a {card_type} status"))
    return after


def _canonical_domain(domain: Any, schema: VaultSchema, fixes: list[MetaFix]) -> Any:
    """A schema domain (its case fixed, else the default) when the schema lists any."""
    if not schema.domains or domain in schema.domains:
        return domain
    fixed = next((d for d in schema.domains
                  if isinstance(domain, str) and d.casefold() == domain.casefold()),
                 schema.default_domain)
    if fixed != domain:
        fixes.append(MetaFix(field="domain", before=domain, after=fixed,
                             why="not a schema domain"))
    return fixed


def _canonical_tags(tags: Any, fixes: list[MetaFix]) -> list[str]:
    """Tags as a list of strings; a string of tags split on commas and spaces."""
    if tags is None:
        tags = []
    elif isinstance(tags, str):
        before = tags
        tags = [t.strip().lstrip("#") for t in tags.replace(",", " ").split() if t.strip()]
        fixes.append(MetaFix(field="tags", before=before, after=tags, why="made a list"))
    return [str(t) for t in tags]


def _canonical_confidence(conf: Any, fixes: list[MetaFix]) -> Any:
    """A Confidence value: as written, upper-cased, or EXTRACTED backfilled."""
    if conf in (c.value for c in Confidence):
        return conf
    fixed = (Confidence(conf.upper()).value
             if isinstance(conf, str) and conf.upper() in Confidence.__members__
             else Confidence.EXTRACTED.value)
    fixes.append(MetaFix(field="confidence", before=conf, after=fixed, why="backfilled"))
    return fixed


# --- applying one fact ------------------------------------------------------------------


class CardFact(BaseModel):
    """One write_card call: a fact about one card, with the operation the model chose."""

    op: CardOp
    type: str
    title: str
    value: str = ""
    field: str | None = None
    confidence: Confidence = Confidence.EXTRACTED
    status: str | None = None
    domain: str | None = None
    description: str | None = None
    links: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    replaces: str | None = None  # for a field-less SUPERSEDE: the old line's value


class Applied(BaseModel):
    op: CardOp  # what was actually done (may differ from what was asked)
    text: str | None = None  # the new card text; None when nothing is written
    note: str = ""
    old_value: str | None = None


def new_card(fact: CardFact, schema: VaultSchema, today: str) -> Card:
    card_type = schema.resolve_type(fact.type)
    assert card_type is not None
    spec = schema.types[card_type]
    status = fact.status if schema.valid_status(card_type, fact.status) else spec.default_status
    stem = card_filename(fact.title)[:-3]
    meta: Meta = {"type": card_type, "title": fact.title.strip(), "status": status,
                  "domain": fact.domain, "tags": list(fact.tags),
                  "description": fact.description or "", "confidence": fact.confidence.value,
                  "created": today, "updated": today}
    meta, _, _ = canonical_meta(meta, schema, stem=stem, today=today)
    return Card(meta=meta, preamble=[f"# {fact.title.strip()}"])


def _history_line(since: str | None, today: str, what: str) -> str:
    return f"- {since or '?'}→{today}: {what}"


def _add_links(card: Card, links: list[str]) -> bool:
    present = {link_key(t) for t in wikilinks(card.body_text())}
    own = link_key(card.title)
    wanted = [t.strip() for t in links if t.strip() and link_key(t) not in present
              and link_key(t) != own]
    if not wanted:
        return False
    section = card.ensure_section(LINKS_HEADING)
    for target in dict.fromkeys(wanted):
        section.append(f"- [[{card_filename(target)[:-3]}]]")
    return True


def apply_fact(card: Card | None, fact: CardFact, schema: VaultSchema, today: str) -> Applied:
    """Apply one fact to a card (None: the card does not exist yet). Pure and idempotent.

    Applying the same fact twice changes nothing the second time, which is what lets a
    rollup that crashed half way run again without writing a card twice.
    - A field holds one value: a new value for a field replaces the old one (SUPERSEDE),
      and the old one moves to ## History as a dated line.
    - An INFERRED value never replaces an EXTRACTED one: the user's own word stands.
    - NOOP writes nothing.
    """
    card_type = schema.resolve_type(fact.type)
    if card_type is None:
        return Applied(op=CardOp.NOOP, note=f"rejected: unknown card type {fact.type!r}")
    if fact.op == CardOp.NOOP:
        return Applied(op=CardOp.NOOP, note="already known")
    if not fact.title.strip():
        return Applied(op=CardOp.NOOP, note="rejected: empty title")
    created = card is None
    if card is None:
        card = new_card(fact, schema, today)
    else:
        card = card.model_copy(deep=True)
    value = " ".join(fact.value.split())
    field = " ".join(fact.field.split()) if fact.field else None
    done = CardOp.ADD if created else CardOp.NOOP
    note = "new card" if created else ""
    old_value: str | None = None
    changed = created
    facts_section = card.ensure_section(FACTS_HEADING) if value else None
    if value and facts_section is not None:
        done, note, value_changed, old_value = _apply_value(
            card, facts_section, FactLine(field=field, value=value, confidence=fact.confidence,
                                          since=today), fact.replaces, today, done, note)
        changed = changed or value_changed
    spec = schema.types[card_type]
    status = card.meta.get("status")
    if (not created and fact.status and fact.status in spec.statuses and fact.status != status):
        card.ensure_section(HISTORY_HEADING).append(
            _history_line(card.meta.get("updated"), today, f"status: {status}"))
        card.meta["status"] = fact.status
        changed = True
        if done != CardOp.ADD or not value:
            done = CardOp.SUPERSEDE
    if not card.meta.get("description") and fact.description:
        card.meta["description"] = fact.description.strip()
        changed = True
    new_tags = [t for t in fact.tags if t not in (card.meta.get("tags") or [])]
    if new_tags:
        card.meta["tags"] = [*(card.meta.get("tags") or []), *new_tags]
        changed = True
    if _add_links(card, fact.links):
        changed = True
        if done == CardOp.NOOP:
            done = CardOp.ADD
    if not changed:
        return Applied(op=CardOp.NOOP, note=note or "already known")
    if facts_section is not None and not facts_section:
        card.sections = [(h, s) for h, s in card.sections if s or h != FACTS_HEADING]
    card.meta["updated"] = today
    return Applied(op=done, text=card.render(), note=note, old_value=old_value)


def _apply_value(card: Card, facts_section: list[str], line: FactLine, replaces: str | None,
                 today: str, done: CardOp,
                 note: str) -> tuple[CardOp, str, bool, str | None]:
    """The fact's value on the card: already known, kept (an EXTRACTED value stands over an
    INFERRED one), SUPERSEDE of the same field's value (or of `replaces`) with the old
    value moved to History, or a new line. Returns (op, note, changed, old value)."""
    field, value = line.field, line.value
    existing = card.facts()
    same_field = [(i, f) for i, f in existing
                  if field and f.field and f.field.casefold() == field.casefold()]
    target: tuple[int, FactLine] | None = same_field[0] if same_field else None
    if target is None and replaces:
        wanted = normalise_value(replaces)
        target = next(((i, f) for i, f in existing
                       if normalise_value(f.value) == wanted), None)
    if target is not None and normalise_value(target[1].value) == normalise_value(value):
        return done, note or "already known", False, None
    if any(normalise_value(f.value) == normalise_value(value)
           and (f.field or "").casefold() == (field or "").casefold()
           for _, f in existing):
        return done, note or "already known", False, None
    if target is not None:
        idx, old = target
        if old.confidence == Confidence.EXTRACTED and line.confidence == Confidence.INFERRED:
            return done, "kept the EXTRACTED value over an INFERRED one", False, None
        facts_section[idx] = line.render()
        what = f"{old.field}: {old.value}" if old.field else old.value
        card.ensure_section(HISTORY_HEADING).append(
            _history_line(old.since, today, f"{what} ({old.confidence.value})"))
        return CardOp.SUPERSEDE, note, True, old.value
    facts_section.append(line.render())
    return (CardOp.ADD if done == CardOp.NOOP else done), note, True, None
