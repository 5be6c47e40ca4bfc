"""The offline model's rollup half: rollups and memory flushes answered by rule.

With no API key Keel still files its memory: facts are pulled out of the user's own words
by a few patterns (English and Russian), summaries are extractive. It is deterministic and
says what it is; it recognises only requests whose system prompt carries
`<keel:rollup kind="...">` and returns None for anything else.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator
from typing import Any

from schemas.vault.graph import similarity
from schemas.vault.rollup import (
    CORE_BLOCK_RE,
    ENTRY_RE,
    SOURCE_RE,
    RollupKind,
    parse_core,
    request_kind,
)

NAME = "keel-offline-rollup"
_ids = itertools.count(1)

# Caps of the extractive summaries: what makes a week cost a fraction of its days.
DAILY_BULLETS = 6
BULLET_CHARS = 160
FOLD_BULLETS = {RollupKind.WEEKLY: 8, RollupKind.MONTHLY: 10, RollupKind.YEARLY: 12}
# Sentences this alike (trigram Jaccard) say the same thing: only the first is kept.
NEAR_DUPLICATE = 0.5

_NAME = r"[A-ZА-ЯЁ][\w'-]+(?: [A-ZА-ЯЁ][\w'-]+)?"
_WORD = r"[A-ZА-ЯЁ0-9][\w&'-]*(?:\.[\w&'-]+)*"
_ORG = rf"{_WORD}(?: {_WORD}){{0,3}}"

# (pattern, card type, field, confidence, op): group "title" names the card, "value" the fact.
_CARD_RULES: list[tuple[re.Pattern[str], str, str | None, str, str]] = [
    (re.compile(rf"(?P<title>{_NAME}) (?:now works|has moved|moved|is now) (?:at|to|for) "
                rf"(?P<value>{_ORG})"), "contact", "employer", "EXTRACTED", "SUPERSEDE"),
    (re.compile(rf"(?P<title>{_NAME}) (?:works|is working) (?:at|for) (?P<value>{_ORG})"),
     "contact", "employer", "EXTRACTED", "ADD"),
    (re.compile(rf"(?P<title>{_NAME}) (?:теперь работает в|перешл[аи] в|перешёл в|перешел в) "
                rf"(?P<value>{_ORG})"), "contact", "employer", "EXTRACTED", "SUPERSEDE"),
    (re.compile(rf"(?P<title>{_NAME}) работает в (?P<value>{_ORG})"),
     "contact", "employer", "EXTRACTED", "ADD"),
    (re.compile(rf"(?:[Mm]et|[Cc]all with|[Mm]eeting with) (?P<title>{_NAME}) from "
                rf"(?P<value>{_ORG})"),
     "contact", "employer", "INFERRED", "ADD"),
    (re.compile(rf"(?:[Вв]стреч\w* с|[Сс]озвон\w* с) (?P<title>{_NAME}) из (?P<value>{_ORG})"),
     "contact", "employer", "INFERRED", "ADD"),
    (re.compile(rf"[Pp]roject (?P<title>{_ORG}) (?:is due|deadline is|has a deadline of|"
                r"ships) (?:on |by )?(?P<value>[^.;\n]+)"),
     "project", "deadline", "EXTRACTED", "ADD"),
    (re.compile(rf"[Пп]роект (?P<title>{_ORG}):? (?:дедлайн|срок сдачи|сдаём|сдаем) "
                r"(?P<value>[^.;\n]+)"), "project", "deadline", "EXTRACTED", "ADD"),
]
_DECISION = [re.compile(r"\b(?:I|we) (?:have )?decided (?:to |that |on )?(?P<value>[^.\n]+)",
                        re.I),
             re.compile(r"\b(?:я|мы) решил[аи]? (?P<value>[^.\n]+)", re.I)]
_REMEMBER = [re.compile(r"\bremember (?:that )?(?P<value>[^\n]+?)[.!]?$", re.I | re.M),
             re.compile(r"\bзапомни,? (?:что )?(?P<value>[^\n]+?)[.!]?$", re.I | re.M)]
_IDEA = [re.compile(r"\b(?:idea|идея)[:—-] ?(?P<value>[^\n]+?)[.!]?$", re.I | re.M)]
_GOAL = [re.compile(r"\b(?:my|our) (?:main )?goal is (?:to )?(?P<value>[^.\n]+)", re.I),
         re.compile(r"\b(?:моя|наша) (?:главная )?цель[:—-]? (?P<value>[^.\n]+)", re.I)]
_PREFER = [re.compile(r"\bI prefer (?P<value>[^.\n]+)", re.I),
           re.compile(r"\bя предпочитаю (?P<value>[^.\n]+)", re.I)]
_CORRECTION = re.compile(
    r"^\s*(?:no[,.!]|nope|that'?s (?:wrong|not right)|that is (?:wrong|not right)|wrong[,.!]|"
    r"not quite|нет[,.!]|неправильно|не так|это неверно)", re.I)


def _title_words(text: str, n: int = 6) -> str:
    words = re.sub(r"[^\w\s'-]", " ", text).split()
    title = " ".join(words[:n])
    return title[:1].upper() + title[1:] if title else "Untitled"


def _sentence(text: str) -> str:
    first = re.split(r"(?<=[.!?])\s", " ".join(text.split()), maxsplit=1)[0]
    return first if len(first) <= BULLET_CHARS else first[: BULLET_CHARS - 1].rstrip() + "…"


def _user_entries(material: str) -> Iterator[tuple[str, str]]:
    for m in ENTRY_RE.finditer(material):
        yield m.group(1), m.group(3)


def extract_facts(material: str) -> list[dict[str, Any]]:
    """write_card inputs for what the user said, by rule."""
    calls: list[dict[str, Any]] = []
    seen: set[tuple[str, str, str]] = set()

    def add(call: dict[str, Any]) -> None:
        key = (call["type"], call["title"].casefold(), call["value"].casefold())
        if key not in seen:
            seen.add(key)
            calls.append(call)

    for role, text in _user_entries(material):
        if role != "user":
            continue
        for rx, card_type, field, conf, op in _CARD_RULES:
            for m in rx.finditer(text):
                value = m.group("value").strip().rstrip(".")
                call = {"op": op, "type": card_type, "title": m.group("title").strip(),
                        "field": field, "value": value, "confidence": conf}
                if card_type == "contact":
                    call["links"] = [value]
                    call["description"] = f"Works at {value}"
                add(call)
        for rx in _DECISION:
            for m in rx.finditer(text):
                value = m.group("value").strip()
                add({"op": "ADD", "type": "decision", "title": _title_words(value),
                     "field": "choice", "value": value, "confidence": "EXTRACTED",
                     "description": _sentence(value)})
        for rx in _REMEMBER:
            for m in rx.finditer(text):
                value = m.group("value").strip()
                add({"op": "ADD", "type": "note", "title": _title_words(value),
                     "value": value, "confidence": "EXTRACTED", "description": _sentence(value)})
        for rx in _IDEA:
            for m in rx.finditer(text):
                value = m.group("value").strip()
                add({"op": "ADD", "type": "idea", "title": _title_words(value),
                     "value": value, "confidence": "EXTRACTED", "description": _sentence(value)})
    return calls


def _core_update(material: str, day: str) -> dict[str, Any]:
    core_match = CORE_BLOCK_RE.search(material)
    core = parse_core(core_match.group(1)) if core_match else None
    goals = list(core.goals) if core else []
    prefs = list(core.preferences) if core else []
    lessons: list[str] = []
    previous_reply = ""
    for role, text in _user_entries(material):
        if role == "assistant":
            previous_reply = _sentence(text)
            continue
        if role != "user":
            continue
        for rx in _GOAL:
            for m in rx.finditer(text):
                goal = m.group("value").strip()
                if goal.casefold() not in (g.casefold() for g in goals):
                    goals.append(goal)
        for rx in _PREFER:
            for m in rx.finditer(text):
                pref = m.group("value").strip()
                if pref.casefold() not in (p.casefold() for p in prefs):
                    prefs.append(pref)
        if _CORRECTION.match(text) and previous_reply:
            lessons.append(f"After \"{previous_reply[:80]}\" the user corrected: "
                           f"\"{_sentence(text)[:120]}\"")
    # The newest goals win: at most three stay active.
    update: dict[str, Any] = {"goals": goals[-3:], "preferences": prefs, "lessons": lessons}
    if core is not None:
        update["facts"] = list(core.facts)
    return update


def select_sentences(sentences: list[str], cap: int, boost: set[str] | None = None
                     ) -> list[str]:
    """The most distinctive sentences, near-duplicates dropped, in their original order.

    A sentence scores the mean rarity (log N/df) of its words across the material, so
    repeated routine lines sink in any language; `boost` marks sentences that carried a
    fact. Deterministic: ties keep the earlier sentence.
    """
    words = [set(re.findall(r"\w+", s.casefold())) for s in sentences]
    df: dict[str, int] = {}
    for ws in words:
        for w in ws:
            df[w] = df.get(w, 0) + 1
    n = max(1, len(sentences))
    scored = []
    for i, (s, ws) in enumerate(zip(sentences, words, strict=True)):
        rarity = sum(math.log(n / df[w]) + 0.1 for w in ws) / max(1, len(ws))
        scored.append((rarity + (1.0 if boost and s in boost else 0.0), -i, s))
    picked: list[tuple[int, str]] = []
    for _, neg_i, s in sorted(scored, reverse=True):
        if len(picked) >= cap:
            break
        if all(similarity(s, p) < NEAR_DUPLICATE for _, p in picked):
            picked.append((-neg_i, s))
    return [s for _, s in sorted(picked)]


def daily_summary(material: str, calls: list[dict[str, Any]]) -> str:
    sentences: list[str] = []
    carried: set[str] = set()
    values = [c["value"].casefold() for c in calls]
    for role, text in _user_entries(material):
        if role != "user":
            continue
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(text.split())):
            sentence = _sentence(sentence)
            if sentence and sentence not in sentences:
                sentences.append(sentence)
                if any(v and v in sentence.casefold() for v in values):
                    carried.add(sentence)
    lines = [f"- {b}" for b in select_sentences(sentences, DAILY_BULLETS, carried)]
    decisions = [c["value"] for c in calls if c["type"] == "decision"]
    if decisions:
        lines.append("- Decided: " + "; ".join(decisions[:3]))
    cards = list(dict.fromkeys(c["title"] for c in calls))
    if cards:
        lines.append("- Cards: " + ", ".join(f"[[{t}]]" for t in cards[:8]))
    return "\n".join(lines) or "- A quiet day: nothing the user said was filed."


def fold_summaries(kind: RollupKind, material: str) -> str:
    """Weekly / monthly / yearly: the most distinctive bullets of the sources, dated, and
    the cards they linked."""
    dated: list[str] = []
    when: dict[str, str] = {}
    links: list[str] = []
    for m in SOURCE_RE.finditer(material):
        period, body = m.group(1), m.group(2)
        for ln in body.splitlines():
            item = ln.strip()
            if item.startswith("- Cards:"):
                links += re.findall(r"\[\[[^\]]+\]\]", item)
            elif item.startswith("- "):
                item = re.sub(r"^- \d{4}-\d{2}(?:-\d{2})?: ", "- ", item)[2:]
                if item not in when:
                    when[item] = period
                    dated.append(item)
    picked = select_sentences(dated, FOLD_BULLETS.get(kind, 8))
    lines = [f"- {when[b]}: {b}" for b in picked]
    if links:
        lines.append("- Cards: " + ", ".join(dict.fromkeys(links)))
    return "\n".join(lines) or "- Nothing was summarised in this period."


def _message(content: list[dict[str, Any]], request: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"msg_offline_rollup_{next(_ids)}",
        "type": "message",
        "role": "assistant",
        "model": NAME,
        "content": content,
        "stop_reason": "tool_use" if any(b["type"] == "tool_use" for b in content)
        else "end_turn",
        "stop_sequence": None,
        # The API's count, left to whoever answers for the API (see model.py's `_message`).
        "usage": {"input_tokens": None, "output_tokens": None},
    }


def _tool(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_offline_{next(_ids)}", "name": name,
            "input": args}


def respond(request: dict[str, Any]) -> dict[str, Any] | None:
    """A Messages API response for a rollup or flush request; None for any other request."""
    found = request_kind(request)
    if found is None:
        return None
    kind, period = found
    material = "\n".join(
        m["content"] if isinstance(m.get("content"), str) else " ".join(
            str(b.get("text", "")) for b in m.get("content") or [] if isinstance(b, dict))
        for m in request.get("messages", []) if m.get("role") == "user")
    if kind in (RollupKind.DAILY, RollupKind.FLUSH):
        calls = extract_facts(material)
        content = [_tool("write_card", c) for c in calls]
        if kind == RollupKind.DAILY:
            content.append(_tool("write_summary", {"summary": daily_summary(material, calls)}))
            content.append(_tool("update_core", _core_update(material, period)))
        if not content:
            content = [{"type": "text", "text": "No durable facts. [offline rollup]"}]
        return _message(content, request)
    return _message([{"type": "text", "text": fold_summaries(kind, material)}], request)
