"""Text at the edge: what PostgreSQL can store, what is binary, and what fits a Temporal payload.

Invariants (pure functions, no I/O):

* ``storable_problem(t) is None`` exactly when ``t`` is stored byte-exact by PostgreSQL text
  and jsonb through psycopg: it holds no NUL (U+0000) and no surrogate code point
  (U+D800-DFFF, which has no UTF-8 form). The JSON-value variant says the same of every
  string, key included, inside dicts and lists, and of what json.dumps or jsonb refuses:
  non-finite numbers, non-string keys, nesting past MAX_JSON_DEPTH, a part met twice.
* ``make_storable`` always returns text that passes ``storable_problem``, changes nothing
  else, says what it replaced, and is idempotent (a second pass changes nothing, says nothing).
* ``describe_binary`` answers None for text (UTF-8 with at most a few stray bytes) and a short
  description for anything else; ``hex_range`` shows a bounded range of bytes as plain ASCII.
* ``visible`` leaves nothing in a text that a terminal would act on: C0 and C1 controls
  (ESC above all), DEL, a lone CR and the bidi embeddings, overrides and isolates are shown
  by a picture of themselves (U+2400's, or <U+XXXX>); tabs, newlines and every printable
  character of any script stay as they are.
* ``payload_problem`` measures the UTF-8 size of a string as the JSON data converter encodes
  it (escapes count) and answers before Temporal's payload limit can fail a workflow task.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from typing import Any


def has_controls(text: str) -> bool:
    """Whether `text` holds a control character or a lone surrogate: a name, an id or a
    path may not (they break a log line, a terminal, a listing, UTF-8)."""
    return any(unicodedata.category(c) in ("Cc", "Cs") for c in text)


# -- what a terminal is shown ----------------------------------------------------------------

# C0 controls but tab and newline, and DEL, as their control pictures (U+2400...); C1
# controls and the bidi embeddings, overrides and isolates as <U+XXXX>.
_SHOWN = {c: chr(0x2400 + c) for c in range(0x20) if c not in (0x09, 0x0A)}
_SHOWN[0x7F] = "\u2421"
_SHOWN.update({c: f"<U+{c:04X}>" for c in (*range(0x80, 0xA0), *range(0x202A, 0x202F),
                                           *range(0x2066, 0x206A))})


def visible(text: str) -> str:
    """`text` with every character a terminal would act on shown instead (see the module's
    invariant); a CRLF line end is a line end."""
    return text.replace("\r\n", "\n").translate(_SHOWN)


def visible_in(value: Any) -> Any:
    """`value` (JSON-like: strings, lists, tuples, dicts) with every string in it `visible`;
    the keys of a dict too, as a caller may show them."""
    if isinstance(value, str):
        return visible(value)
    if type(value) in (list, tuple):  # not a named tuple: its fields are no text
        return type(value)(visible_in(v) for v in value)
    if isinstance(value, dict):
        return {visible_in(k): visible_in(v) for k, v in value.items()}
    return value


# -- storable text -----------------------------------------------------------------------

# NUL: PostgreSQL text cannot hold it, and jsonb rejects the \u0000 escape.
# Surrogates: psycopg encodes str as UTF-8, which has no form for U+D800-DFFF, paired or not
# (a pair inside a Python str is two code points, not the character it would stand for).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")

# NUL becomes U+FFFD, the same mark as a lost surrogate and as ``bytes.decode(errors=
# "replace")`` leaves for a bad byte: one mark meaning "a character that could not be kept
# was here", which models and people already read that way. A visible U+2400 (␀) would be
# mistaken for a character the writer typed; the notes say what the marks stand for.
REPLACEMENT = "\ufffd"


def _what(ch: str) -> tuple[str, str]:
    if ch == "\x00":
        return "a NUL character (U+0000)", "PostgreSQL text cannot store NUL"
    return (f"a surrogate code point (U+{ord(ch):04X})",
            "a surrogate is not a character and has no UTF-8 form")


def storable_problem(text: str) -> str | None:
    """Why PostgreSQL cannot store ``text`` exactly, as one sentence; None when it can."""
    first = _UNSTORABLE.search(text)
    if first is None:
        return None
    count = _UNSTORABLE.subn("", text)[1]
    more = f" ({count} unstorable code points in all)" if count > 1 else ""
    name, why = _what(first.group())
    return f"the text has {name} at offset {first.start()}{more}; {why}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _replace(text: str) -> tuple[str, dict[str, int]]:
    counts = {"nul": 0, "lone": 0, "pair": 0}
    if _UNSTORABLE.search(text) is None:
        return text, counts

    def join(m: re.Match[str]) -> str:
        counts["pair"] += 1
        return m.group().encode("utf-16-le", "surrogatepass").decode("utf-16-le")

    joined = _PAIR.sub(join, text)
    out, replaced = _UNSTORABLE.subn(REPLACEMENT, joined)
    counts["nul"] = joined.count("\x00")
    counts["lone"] = replaced - counts["nul"]
    return out, counts


def _notes(counts: dict[str, int], where: str = "") -> list[str]:
    words = {"nul": ("NUL character", "replaced with U+FFFD"),
             "lone": ("lone surrogate", "replaced with U+FFFD"),
             "pair": ("surrogate pair", "joined into the character it encodes")}
    return [f"{_plural(counts[k], noun)} {verb}{where}"
            for k, (noun, verb) in words.items() if counts.get(k)]


def make_storable(text: str) -> tuple[str, list[str]]:
    """``text`` with every NUL and lone surrogate replaced by U+FFFD, and notes saying so
    ("2 NUL characters replaced with U+FFFD"); no notes when nothing changed.

    A surrogate pair (high then low) is joined into the character it encodes instead,
    since that is what its writer meant. Text that is already storable comes back as is.
    """
    out, counts = _replace(text)
    return out, _notes(counts)


# A place in a JSON value, as a linked list from the leaf up: (parent, key) or None at the
# top, so walking a deep value costs nothing per level and only a reported place is rendered.
_Where = tuple[Any, str | int] | None
_PATH_SHOWN = 8  # the innermost levels a place names; deeper ones are shown as "..."


def _path(where: _Where) -> str:
    parts: list[str | int] = []
    while where is not None and len(parts) <= _PATH_SHOWN:
        where, key = where
        parts.append(key)
    cut = "..." if len(parts) > _PATH_SHOWN else ""
    shown = "".join(f"[{json.dumps(p, ensure_ascii=True)}]" for p in reversed(parts[:_PATH_SHOWN]))
    return (cut + shown) or "the top level"


def _value_problem(value: Any) -> str | None:
    if value is None or isinstance(value, bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"the number {value} is not valid JSON"
    if isinstance(value, str):
        return storable_problem(value)
    return f"a {type(value).__name__} is not a JSON value"


# psycopg writes jsonb with json.dumps, which gives up near Python's recursion limit (1000);
# a value deeper than this, or one that holds itself, cannot be written at all.
MAX_JSON_DEPTH = 500


def storable_json_problem(value: Any) -> str | None:
    """Why jsonb cannot store ``value`` exactly (the first place found, walking dicts and
    lists in order, keys included), as one sentence naming where; None when it can.

    Besides unstorable strings: non-string keys, non-finite numbers, non-JSON values,
    nesting deeper than MAX_JSON_DEPTH, and a list or dict met twice (a cycle or a shared
    part; JSON parsing never makes one)."""
    stack: list[tuple[Any, _Where, int]] = [(value, None, 0)]
    seen: set[int] = set()
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth >= MAX_JSON_DEPTH:
                return f"at {_path(where)}: nested deeper than {MAX_JSON_DEPTH} levels"
            if item and id(item) in seen:  # () is shared by all, and harmless
                return f"at {_path(where)}: the same {type(item).__name__} appears twice"
            seen.add(id(item))
        if isinstance(item, dict):
            children: list[tuple[Any, _Where, int]] = []
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"at {_path(where)}: the key {key!r} is not a string"
                problem = storable_problem(key)
                if problem:
                    return f"at {_path(where)}: a key is unstorable: {problem}"
                children.append((child, (where, key), depth + 1))
            stack.extend(reversed(children))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([(c, (where, i), depth + 1) for i, c in enumerate(item)]))
        else:
            problem = _value_problem(item)
            if problem:
                return f"at {_path(where)}: {problem}"
    return None


def make_storable_json(value: Any) -> tuple[Any, list[str]]:
    """``value`` with every string (keys too) made storable, non-finite numbers made null and
    non-JSON values made strings; notes saying what changed, naming the first place.

    Nothing storable is dropped: a key that collides with another after replacement gets
    U+FFFD appended until it is unique. Only what no JSON can hold is replaced by a note in
    its place: a part nested deeper than MAX_JSON_DEPTH, a list or dict met a second time.
    Walks without recursion, so depth cannot exhaust the stack.
    """
    if storable_json_problem(value) is None:
        return value, []
    cleaner = _JsonCleaner()
    return cleaner.copy(value), cleaner.notes()


# One step of the walk: fill ``holder[slot]`` with the storable copy of ``item``.
_Task = tuple[Any, _Where, Any, Any, int]


class _JsonCleaner:
    """One walk of `make_storable_json`: the storable copy, and what was changed where."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.first: dict[str, str] = {}
        self.seen: set[int] = set()

    def note(self, kind: str, where: _Where, n: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + n
        if kind not in self.first:
            self.first[kind] = _path(where)

    def leaf(self, item: Any, where: _Where) -> Any:
        if isinstance(item, str):
            fixed, found = _replace(item)
            for kind, n in found.items():
                if n:
                    self.note(kind, where, n)
            return fixed
        if isinstance(item, float) and not math.isfinite(item):
            self.note("non-finite number|replaced with null", where)
            return None
        if item is None or isinstance(item, bool | int | float):
            return item
        self.note("non-JSON value|replaced with its text", where)
        return _replace(str(item))[0]

    def copy(self, value: Any) -> Any:
        root: list[Any] = [None]
        tasks: list[_Task] = [(value, None, root, 0, 0)]
        while tasks:
            item, where, holder, slot, depth = tasks.pop()
            if isinstance(item, dict | list | tuple) and self._not_kept(item, where, holder,
                                                                        slot, depth):
                continue
            if isinstance(item, dict):
                tasks.extend(reversed(self._dict(item, where, holder, slot, depth)))
            elif isinstance(item, list | tuple):
                seq: list[Any] = [None] * len(item)
                holder[slot] = seq
                tasks.extend(reversed([(c, (where, i), seq, i, depth + 1)
                                       for i, c in enumerate(item)]))
            else:
                holder[slot] = self.leaf(item, where)
        return root[0]

    def _not_kept(self, item: Any, where: _Where, holder: Any, slot: Any, depth: int) -> bool:
        """A container too deep or met before: a note in its place (True)."""
        if depth >= MAX_JSON_DEPTH:
            self.note(f"part nested deeper than {MAX_JSON_DEPTH} levels|replaced with a "
                      "note", where)
            holder[slot] = f"(nested deeper than {MAX_JSON_DEPTH} levels; not kept)"
            return True
        if item and id(item) in self.seen:  # () is shared by all, and harmless
            self.note("repeated part|replaced with a note", where)
            holder[slot] = "(the same value again; not repeated)"
            return True
        self.seen.add(id(item))
        return False

    def _dict(self, item: dict[Any, Any], where: _Where, holder: Any, slot: Any,
              depth: int) -> list[_Task]:
        out: dict[str, Any] = {}
        holder[slot] = out
        pending: list[_Task] = []
        for key, child in item.items():
            k = self.leaf(key if isinstance(key, str) else str(key), where)
            if not isinstance(key, str):
                self.note("non-string key|replaced with its text", where)
            while k in out:
                k += REPLACEMENT
                self.note("colliding key|made unique with U+FFFD", where)
            out[k] = None
            pending.append((child, (where, k), out, k, depth + 1))
        return pending

    def notes(self) -> list[str]:
        counts, first = dict(self.counts), self.first
        text_counts = {k: counts.pop(k) for k in ("nul", "lone", "pair") if k in counts}
        notes = [n for k in text_counts
                 for n in _notes({k: text_counts[k]}, f" (first at {first[k]})")]
        notes += [f"{_plural(n, kind.split('|')[0])} {kind.split('|')[1]} "
                  f"(first at {first[kind]})" for kind, n in counts.items()]
        return notes


# -- binary files ------------------------------------------------------------------------

# Text may carry a few stray bytes (one bad byte in a log, a Latin-1 name in a UTF-8 file):
# it stays text, the bytes shown as U+FFFD. More than this many invalid sequences, and more
# than 1 in 100 bytes, means the file is not UTF-8 text. Real binaries almost always hold
# NUL bytes (any NUL makes a file binary: UTF-8 text has no use for it); this rule catches
# the small or NUL-free rest. Latin-1 prose (3-5 % accented bytes) counts as binary and can
# still be read as hex.
INVALID_UTF8_TOLERANCE = 8
INVALID_UTF8_RATIO = 0.01
# Control characters other than tab, newline, CR, form feed, vertical tab, backspace and
# ESC (ANSI colour codes in logs) are absent from text; a tenth of the characters being
# such controls means a binary format that happens to be valid UTF-8.
CONTROL_RATIO = 0.10
_CONTROL = re.compile("[\x01-\x07\x0e-\x1a\x1c-\x1f\x7f\x80-\x9f]")

HEX_MAX_BYTES = 1024  # 64 lines, about 5 KB of text: a useful view at a bounded token cost
_HEX_WIDTH = 16

_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "PNG image"), (b"\xff\xd8\xff", "JPEG image"),
    (b"GIF8", "GIF image"), (b"%PDF-", "PDF document"), (b"PK\x03\x04", "ZIP archive"),
    (b"\x1f\x8b", "gzip data"), (b"\x7fELF", "ELF executable"),
    (b"SQLite format 3\x00", "SQLite database"), (b"\xff\xfe", "UTF-16 (little-endian) text"),
    (b"\xfe\xff", "UTF-16 (big-endian) text"),
)


def _invalid(data: bytes, decoded: str) -> int:
    return decoded.count(REPLACEMENT) - data.count(REPLACEMENT.encode("utf-8"))


def invalid_utf8_sequences(data: bytes) -> int:
    """How many invalid UTF-8 sequences ``data`` holds (each shown as one U+FFFD)."""
    return _invalid(data, data.decode("utf-8", errors="replace"))


def _binary_reason(data: bytes) -> str | None:
    nul = data.find(b"\x00")
    if nul >= 0:
        return f"it holds NUL bytes (the first at offset {nul})"
    text = data.decode("utf-8", errors="replace")
    bad = _invalid(data, text)
    if bad > INVALID_UTF8_TOLERANCE and bad > INVALID_UTF8_RATIO * len(data):
        return f"it is not UTF-8 text ({bad} invalid sequences)"
    controls = _CONTROL.subn("", text)[1]
    if controls > INVALID_UTF8_TOLERANCE and controls > CONTROL_RATIO * len(text):
        return f"{controls} of its {len(text)} characters are control characters"
    return None


def describe_binary(data: bytes, path: str) -> str | None:
    """None when ``data`` is text; otherwise what the model is told instead of the bytes."""
    reason = _binary_reason(data)
    if reason is None:
        return None
    kind = next((name for magic, name in _MAGIC if data.startswith(magic)), None)
    looks = f", it looks like a {kind}" if kind else ""
    name = make_storable(path)[0]
    return (f"{name}: binary file, {len(data)} bytes, not shown ({reason}{looks}). "
            f"Read a range as hex by giving offset and length (at most {HEX_MAX_BYTES} "
            "bytes at a time).")


def hex_range(data: bytes, offset: int, length: int) -> str:
    """Bytes ``offset`` to ``offset + length`` (at most HEX_MAX_BYTES) as a hexdump: offset,
    16 bytes in hex, and the printable ASCII. Raises ValueError for a negative offset or a
    length below 1; an offset at or past the end answers with the file's size."""
    if offset < 0:
        raise ValueError(f"offset must be 0 or more, not {offset}")
    if length < 1:
        raise ValueError(f"length must be 1 or more, not {length}")
    size = len(data)
    if offset >= size:
        return f"offset {offset} is at or past the end; the file has {size} bytes"
    shown = min(length, HEX_MAX_BYTES, size - offset)
    capped = length > HEX_MAX_BYTES and size - offset > HEX_MAX_BYTES
    cut = f" (length capped at {HEX_MAX_BYTES})" if capped else ""
    lines = [f"bytes {offset} to {offset + shown - 1} of {size}{cut}:"]
    chunk = data[offset:offset + shown]
    for i in range(0, shown, _HEX_WIDTH):
        row = chunk[i:i + _HEX_WIDTH]
        hexes = " ".join(f"{b:02x}" for b in row)
        text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in row)
        lines.append(f"{offset + i:08x}  {hexes:<{_HEX_WIDTH * 3 - 1}}  |{text}|")
    return "\n".join(lines)


# -- payload size ------------------------------------------------------------------------

# Temporal refuses a payload over 2 MiB (limit.blobSize.error) and fails the workflow task
# that carries it. A user's message travels in the update request, is echoed in the update's
# acceptance and goes on into activity inputs beside other fields, all inside one workflow
# task completion that gRPC caps at 4 MiB. Half the blob limit keeps room for two copies and
# their envelopes; a message this long belongs in a workspace file.
TEMPORAL_BLOB_LIMIT_BYTES = 2 * 1024 * 1024
PAYLOAD_LIMIT_BYTES = TEMPORAL_BLOB_LIMIT_BYTES // 2


def json_size(text: str) -> int:
    """UTF-8 bytes of ``text`` as a JSON string, quotes and escapes included (a control
    character costs up to 6 bytes; a surrogate, which the converter refuses, is counted as
    its 6-byte escape)."""
    encoded = json.dumps(text, ensure_ascii=False)
    return len(encoded.encode("utf-8", errors="surrogatepass")) + 3 * _SURROGATE.subn(
        "", encoded)[1]


def payload_problem(text: str, limit: int = PAYLOAD_LIMIT_BYTES) -> str | None:
    """Why ``text`` is too big to send through Temporal, as one sentence; None when it fits."""
    if len(text) > limit:  # every character costs at least one byte: no need to encode
        return (f"the message has {len(text)} characters, more than the {limit} bytes a "
                "message can take; put long material in a file in the workspace and refer "
                "to it")
    size = json_size(text)
    if size > limit:
        return (f"the message is {size} bytes as sent, more than the {limit} bytes a message "
                "can take; put long material in a file in the workspace and refer to it")
    return None
