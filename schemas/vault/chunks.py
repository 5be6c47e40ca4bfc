"""How a search document is cut into chunks for the dense index. Pure rules.

Invariants:
- The chunks of a body cover it in order without overlap: chunk i is
  `body[start:end]`, each start is the previous end, the last end is `len(body)` (leading
  and trailing blank space included). Nothing is cut off, however long the document: a
  body over `MAX_CHUNKS` chunks is cut into that many longer pieces, never truncated.
- A chunk never crosses a markdown heading; its `heading` is the path of headings above it
  (' > ' between levels), outside fenced code blocks.
- A piece of text that fits `CHUNK_CHARS` stays whole; a longer section is split at blank
  lines, then line ends, then sentence ends, then spaces, and only then mid-word.
- What gets embedded (`Chunk.text`) is the chunk's own words led by the document title and
  its heading path; a daily-transcript entry embeds as `speaker: words`, without the entry's
  time, session id and marker.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from schemas.vault.rollup import parse_entry

CHUNK_CHARS = 1_200
MAX_CHUNKS = 512
HEADING_SEP = " > "

_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_BREAKS = (re.compile(r"\n[ \t]*\n"), re.compile(r"\n"), re.compile(r"(?<=[.!?…。])\s"),
           re.compile(r"\s"))


class Chunk(BaseModel):
    index: int
    start: int
    end: int
    heading: str = ""
    text: str  # what is embedded


def sections(body: str) -> list[tuple[int, int, str]]:
    """(start, end, heading path) of the body's parts between markdown headings."""
    out: list[tuple[int, int, str]] = []
    path: list[tuple[int, str]] = []
    start, pos, fenced = 0, 0, False
    heading = ""
    for line in body.splitlines(keepends=True):
        if _FENCE.match(line):
            fenced = not fenced
        m = None if fenced else _HEADING.match(line.rstrip("\r\n"))
        if m and pos > start:
            out.append((start, pos, heading))
            start = pos
        if m:
            level = len(m.group(1))
            path = [(lv, t) for lv, t in path if lv < level] + [(level, m.group(2).strip())]
            heading = HEADING_SEP.join(t for _, t in path)
        pos += len(line)
    out.append((start, len(body), heading))
    return [s for s in out if s[1] > s[0]] or [(0, len(body), "")]


def split_span(text: str, start: int, end: int, limit: int) -> list[tuple[int, int]]:
    """Cut text[start:end] into spans of at most `limit` characters at the best breaks
    (a loop, not a recursion: a section of megabytes is thousands of spans)."""
    spans: list[tuple[int, int]] = []
    while end - start > limit:
        cut = next((c for c in (_last_break(p, text, start, start + limit) for p in _BREAKS)
                    if c is not None), start + limit)
        spans.append((start, cut))
        start = cut
    spans.append((start, end))
    return spans


def _last_break(pattern: re.Pattern[str], text: str, lo: int, hi: int) -> int | None:
    """The end of the last match of `pattern` in text[lo:hi] past its first quarter."""
    best = None
    for m in pattern.finditer(text, lo + (hi - lo) // 4, hi):
        best = m.end()
    return best if best is not None and lo < best < hi else None


def chunk_spans(body: str, limit: int = CHUNK_CHARS) -> list[tuple[int, int, str]]:
    """(start, end, heading) of every chunk of `body`, covering it whole and in order."""
    spans = [(a, b, h) for s, e, h in sections(body) for a, b in split_span(body, s, e, limit)]
    if len(spans) > MAX_CHUNKS:  # a huge body: longer pieces, still all of it
        return chunk_spans(body, limit * (len(spans) // MAX_CHUNKS + 1))
    return spans


def chunk_document(kind: str, title: str, body: str) -> list[Chunk]:
    """The chunks of one search document and the text each is embedded from."""
    if kind == "daily":
        role, when, words = parse_entry(body)
        heading = f"{when} · {role}" if when else role
        at = body.find(words) if words else -1
        if at < 0:
            return [Chunk(index=0, start=0, end=len(body), heading=heading, text=body.strip())]
        inner = [(at + a, at + b) for a, b, _ in chunk_spans(words)]
        # The entry's heading line belongs to its first chunk, its tail to its last.
        outer = [(0 if i == 0 else a, len(body) if i == len(inner) - 1 else b)
                 for i, (a, b) in enumerate(inner)]
        return [Chunk(index=i, start=o[0], end=o[1], heading=heading,
                      text=f"{role}: {body[a:b].strip()}")
                for i, ((a, b), o) in enumerate(zip(inner, outer, strict=True))]
    chunks = []
    for i, (a, b, heading) in enumerate(chunk_spans(body)):
        lead = HEADING_SEP.join(x for x in (title.strip(), heading) if x)
        words = body[a:b].strip()
        chunks.append(Chunk(index=i, start=a, end=b, heading=heading,
                            text=f"{lead}\n{words}" if lead else words))
    return chunks
