"""What the memory benchmark checks once a session has been driven, and the figures it reports.

Each checkpoint is judged against the database's own record (the `messages` table, byte for
byte, and the stored checkpoints) plus the queries snapshotted by the drive, and the API's
side is what the fake counted; kept apart from the drive, which only plays the user.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from bench.memory_drive import (
    _DECISION,
    APPROVAL,
    CONSTRAINT,
    FIRST_PR,
    Drive,
    Scenario,
)
from schemas.checkpoint.mind import MindDocument, entry_survives
from tests.fake_anthropic import FakeAnthropic
from tests.queue_fixture import FIRST_REQUEST

# ----- checking what survived ----------------------------------------------------------------

_REVIEWED = re.compile(r"^\[offline model\] Reviewed PR #(\d+):")
_RESOLVED = re.compile(r"^Approved PR #(\d+): I reviewed PR #\d+ myself")
_NOW_POSITION = re.compile(r"reviewed through PR #(\d+)")
RE_ASKED = "re-asked after approval"


@dataclass
class Event:
    seq: int
    pr: int
    kind: str  # reviewed | decision
    verdict: str  # ok | skipped to #n | repeated #n | re-asked after approval


def queue_events(rows: list[dict[str, Any]]) -> tuple[list[Event], list[tuple[int, int | None]]]:
    """Every final reply about a PR, judged against the true next PR; and (seq, last PR
    whose review the conversation states) at each row, for checking the now and the mind."""
    events: list[Event] = []
    stated: list[tuple[int, int | None]] = []
    last_done: int | None = None  # the queue as the user sees it: an approval settles a PR
    reviewed: int | None = None  # what the conversation says was reviewed
    pending: int | None = None
    approved: int | None = None
    for r in rows:
        text, seq = r["content_text"], r["seq"]
        if r["type"] == "user":
            if text == APPROVAL and pending is not None:
                last_done, approved, pending = pending, pending, None
            elif m := _RESOLVED.match(text):
                last_done = reviewed = int(m[1])
                approved = None
        elif m := _REVIEWED.match(text) or _DECISION.match(text):
            pr = int(m[1])
            kind = "reviewed" if text.startswith("[offline model] Reviewed") else "decision"
            expected = FIRST_PR if last_done is None else last_done + 1
            if kind == "decision" and approved == pr:
                verdict = RE_ASKED
            elif pr == expected or (kind == "reviewed" and approved == pr):
                verdict = "ok"  # (a review of the PR the user has just approved settles it)
                verdict = "ok"
            else:
                verdict = f"skipped to #{pr} (expected #{expected})" if pr > expected else \
                    f"repeated #{pr} (expected #{expected})"
            events.append(Event(seq, pr, kind, verdict))
            if kind == "reviewed":
                last_done = reviewed = pr
                pending = approved = None
            elif verdict != RE_ASKED:
                pending, approved = pr, None
        stated.append((seq, reviewed))
    return events, stated


def mission_check(reference: list[str], text: str) -> list[str]:
    """The reference entries that no longer stand in `text` (word for word, or with a
    status marked on the entry)."""
    current = MindDocument(text=text).mission_entries()
    return [e for e in reference if e not in text and not entry_survives(e, current)]


@dataclass
class CheckpointReport:
    n: int
    turn: int | None
    kind: str
    portion: float | None
    record_seq: int
    cut_seq: int
    upto_seq: int
    moved_out: int
    rendered_tokens: int
    record_tokens_before_cut: int
    mission_lost: list[str]
    memo_entries: int
    memo_exact: int
    memo_problems: list[str]
    memo_dropped: list[int]
    words: dict[str, str]
    queue_verdict: str
    now_position: int | None
    mind_position: int | None
    true_position: int | None
    harness_in_memo: list[str]
    fallbacks: list[str]
    rendered: str
    view: str | None = None
    mind_tokens: int = 0

    @property
    def saw_newest_step(self) -> bool:
        """A model checkpoint shown the conversation up to the newest step (at most the
        newest tool output's text left out, as it stays in the verbatim tail)."""
        if self.kind != "model":
            return False
        if self.view is None:  # before views were recorded: the portion says it
            return self.portion in (None, 1.0)
        return self.view in ("full", "without_newest_output")

    @property
    def mission_ok(self) -> bool:
        return not self.mission_lost

    @property
    def words_ok(self) -> bool:
        return all(v in ("live window", "carried", "memo (full)") for v in self.words.values())

    @property
    def queue_ok(self) -> bool:
        # A re-ask after an approval is the offline model's own loop (it happens with no
        # checkpoint at all); it is counted on its own line, not as a position lost here.
        return self.queue_verdict in ("ok", RE_ASKED, "n/a (no reply after it)")

    @property
    def survived(self) -> bool:
        """The survival checks: Mission, the user's words, the queue, no harness words."""
        return (self.mission_ok and self.memo_exact == self.memo_entries and self.words_ok
                and self.queue_ok and not self.harness_in_memo)

    def observations(self) -> list[str]:
        """Not survival failures (the live window still holds the truth), but worth a look."""
        out = []
        if self.now_position != self.true_position:
            out.append(f"the now says reviewed through #{self.now_position}; the conversation "
                       f"up to #{self.upto_seq} says #{self.true_position}")
        if self.mind_position != self.true_position:
            out.append(f"the mind's workstream says reviewed through #{self.mind_position}; "
                       f"truth #{self.true_position}")
        return out


async def check_session(conn: AsyncConnection, sc: Scenario, d: Drive) -> dict[str, Any]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            "SELECT seq, type, content_text, token_count, turn FROM messages"
            " WHERE session_id=%s ORDER BY seq", (d.session_id,))
        messages = await cur.fetchall()
        await cur.execute(
            "SELECT c.checkpoint_id, c.kind, c.record_seq, c.cut_seq, c.upto_seq, c.mind_text,"
            " c.mind_context_text, c.memo, c.memo_dropped_seqs, c.now_text, c.rendered,"
            " c.rendered_tokens, c.tokens_moved_out, c.carried_seqs, c.fallbacks,"
            " (a.rounds -> 0 -> 'meta' ->> 'portion')::float AS portion,"
            " a.rounds -> 0 -> 'meta' ->> 'view' AS view, a.candidates"
            " FROM checkpoints c LEFT JOIN checkpoint_attempts a"
            " ON c.checkpoint_id = 'ckpt:' || a.attempt_id"
            " WHERE c.session_id=%s ORDER BY c.record_seq", (d.session_id,))
        checkpoints = await cur.fetchall()
    by_seq = {m["seq"]: m for m in messages}
    harness_texts = [bg.text for bg in sc.background]
    important = {"first request": FIRST_REQUEST}
    if sc.constraint_turn:
        important["constraint"] = CONSTRAINT
    important_seqs = {
        label: next((m["seq"] for m in messages if m["type"] == "user"
                     and m["content_text"] == text), None)
        for label, text in important.items()}
    events, stated = queue_events(messages)
    snapshots = {s.checkpoint_count: s for s in d.snapshots}
    reference: list[str] = []
    reports: list[CheckpointReport] = []
    for n, ck in enumerate(checkpoints, 1):
        if n == 1:
            reference = MindDocument(text=ck["mind_text"]).mission_entries()
        snap = snapshots.get(n)
        lost = [] if reference else ["(the first checkpoint wrote no Mission entry)"]
        for text in [ck["mind_text"], ck["mind_context_text"], *([snap.mind] if snap else [])]:
            lost += [m for m in mission_check(reference, text) if m not in lost]
        # The memo: every entry is the user's own message, byte for byte, and shown so.
        problems: list[str] = []
        exact = 0
        harness_hits: list[str] = []
        entries = ck["memo"]
        for e in entries:
            row = by_seq.get(int(e["seq"]))
            if row is None:
                problems.append(f"#{e['seq']}: no such message")
                continue
            if row["type"] != "user":
                harness_hits.append(f"#{e['seq']} is a {row['type']} message")
            original: bytes = row["content_text"].encode()
            kept: bytes = e["text"].encode()
            same = kept == original and not e["cut"]
            prefix = bool(e["cut"]) and original.startswith(kept)
            shown = e["text"] in ck["rendered"]
            if (same or prefix) and shown:
                exact += 1
            else:
                problems.append(f"#{e['seq']}: " + ("not the original or a prefix of it"
                                                    if not (same or prefix) else
                                                    "not in the rendered checkpoint"))
        memo_blob = "\n".join(e["text"] for e in entries) + (snap.memo if snap else "")
        harness_hits += [f"background text in the memo: {t[:50]!r}" for t in harness_texts
                         if t in memo_blob]
        # The user's first request and constraint, in full, where the context has them.
        words: dict[str, str] = {}
        for label, seq in important_seqs.items():
            if seq is None or seq > ck["upto_seq"]:
                continue  # not sent yet
            entry = next((e for e in entries if int(e["seq"]) == seq), None)
            if seq >= ck["cut_seq"]:
                where = "live window"
            elif seq in ck["carried_seqs"]:
                where = "carried"
            elif entry and not entry["cut"] and entry["text"] == important[label]:
                where = "memo (full)"
            elif entry:
                where = f"CUT to {len(entry['text'])}/{len(important[label])} chars"
            elif seq in ck["memo_dropped_seqs"]:
                where = "DROPPED (record only)"
            else:
                where = "MISSING"
            words[label] = where
        after = next((ev for ev in events if ev.seq > ck["record_seq"]), None)
        now_pos = [int(x) for x in _NOW_POSITION.findall(ck["now_text"])]
        mind_pos = [int(x) for x in _NOW_POSITION.findall(ck["mind_text"])]
        truth = next((r for s, r in reversed(stated) if s <= ck["upto_seq"]), None)
        before_cut = sum(m["token_count"] for m in messages
                         if m["seq"] < ck["cut_seq"] and m["type"] != "checkpoint")
        turn = next((m["turn"] for m in reversed(messages)
                     if m["seq"] < ck["record_seq"] and m["turn"] is not None), None)
        reports.append(CheckpointReport(
            n=n, turn=turn, kind=ck["kind"], portion=ck["portion"],
            record_seq=ck["record_seq"], cut_seq=ck["cut_seq"], upto_seq=ck["upto_seq"],
            moved_out=ck["tokens_moved_out"], rendered_tokens=ck["rendered_tokens"],
            record_tokens_before_cut=before_cut, mission_lost=lost,
            memo_entries=len(entries), memo_exact=exact, memo_problems=problems,
            memo_dropped=list(ck["memo_dropped_seqs"]), words=words,
            queue_verdict=after.verdict if after else "n/a (no reply after it)",
            now_position=max(now_pos) if now_pos else None,
            mind_position=max(mind_pos) if mind_pos else None, true_position=truth,
            harness_in_memo=harness_hits, fallbacks=list(ck["fallbacks"]),
            rendered=ck["rendered"], view=ck["view"],
            mind_tokens=MindDocument(text=ck["mind_text"]).total_tokens()))
    reviews = sorted(int(p.stem) for p in d.workspace.glob("reviews/*.md"))
    last_cut = checkpoints[-1]["cut_seq"] if checkpoints else 0
    user_seqs = [m["seq"] for m in messages if m["type"] == "user"]
    harness_rows = [m for m in messages if m["type"] == "harness"]
    return {
        "reports": reports, "reference_mission": reference,
        "reviews_written": len(reviews),
        "reviews_range": [reviews[0], reviews[-1]] if reviews else [],
        "queue_errors": [f"#{e.pr} at seq {e.seq}: {e.verdict}" for e in events
                         if e.verdict not in ("ok", RE_ASKED)],
        "replies_next_pr": f"{sum(e.verdict in ('ok', RE_ASKED) for e in events)}/{len(events)}",
        "re_asked": [e.pr for e in events if e.verdict == RE_ASKED],
        "background_inputs": len(harness_rows),
        "background_condensed": sum(1 for m in harness_rows if m["seq"] < last_cut),
        "important_seqs": important_seqs,
        "lost_user_messages": lost_without_release(checkpoints, user_seqs),
    }


def lost_without_release(checkpoints: list[dict[str, Any]], user_seqs: list[int]) -> list[int]:
    """The user's messages that left the context at some checkpoint without being in its
    memo, carried, or released by the writer's choice in a checklist (the checkpoint's
    own, or an earlier one): each should be none."""
    released: set[int] = set()
    lost: set[int] = set()
    for ck in checkpoints:
        kept = {int(e["seq"]) for e in ck["memo"]} | set(ck["memo_dropped_seqs"])
        offered = {int(c["seq"]) for c in ck["candidates"] or []} or kept
        released = (released | (offered - kept)) - kept
        lost |= {seq for seq in user_seqs if seq < ck["cut_seq"] and seq not in kept
                 and seq not in ck["carried_seqs"] and seq not in released}
    return sorted(lost)


# ----- what the API saw ----------------------------------------------------------------------

CHECKPOINT_MARKER = "<keel-checkpoint-request>"
ROLLUP_MARKER = "<keel:rollup"
TOO_LONG_WORDS = ("prompt is too long", "exceed context limit")


def _kind(body: dict[str, Any]) -> str:
    text = json.dumps(body.get("messages", []), ensure_ascii=False)
    if ROLLUP_MARKER in text:
        return "memory flush"
    return "checkpoint round" if CHECKPOINT_MARKER in text else "turn"


def api_figures(fake: FakeAnthropic, first_request: int, first_usage: int) -> dict[str, Any]:
    """The session's requests as the API counted them: those refused as too long (where,
    and which rung took the request on), and the share of input read from the cache."""
    requests = fake.requests[first_request:]
    refused = {id(r.body) for r in fake.rejections
               if any(w in r.message for w in TOO_LONG_WORDS)}
    refusals: list[dict[str, str]] = []
    for i, body in enumerate(requests):
        if id(body) not in refused:
            continue
        handled = "nothing (the session ended)"
        for later in requests[i + 1:]:
            if id(later) in refused:
                continue
            kind = _kind(later)
            if kind != "turn":
                handled = "checkpoint"
                break
            handled = "sent again, made to fit"
            break
        refusals.append({"where": _kind(body), "handled_by": handled})
    usages = fake.usages[first_usage:]
    total = sum(u.total_input for u in usages)
    return {"requests": len(requests), "refused_too_long": len(refusals),
            "refusals": refusals,
            "cache_read_share": round(sum(u.cache_read for u in usages) / max(1, total), 4),
            "input_tokens_total": total}


# ----- a session's figures ---------------------------------------------------------------------

def summarize(sc: Scenario, d: Drive, checked: dict[str, Any]) -> dict[str, Any]:
    reports: list[CheckpointReport] = checked["reports"]
    n = len(reports)

    def rate(flags: list[bool]) -> str:
        return f"{sum(flags)}/{len(flags)}" if flags else "-"

    fallbacks: list[str] = []
    for r in reports:
        for f in r.fallbacks:
            short = f.split("(")[0].split(";")[0].strip()
            if short not in fallbacks:
                fallbacks.append(short)
    return {
        "scenario": sc.name, "session_id": d.session_id, "asks": d.asks,
        "seconds": round(d.seconds, 1), "checkpoints": n,
        "half_checkpoints": sum(1 for r in reports if r.portion is not None and r.portion < 1),
        "model_checkpoints_saw_newest_step": rate([r.saw_newest_step for r in reports
                                                   if r.kind == "model"]),
        "views": {v: sum(1 for r in reports if (r.view or "-") == v)
                  for v in sorted({r.view or "-" for r in reports})},
        "mind_tokens_last": reports[-1].mind_tokens if reports else 0,
        "kinds": sorted({r.kind for r in reports}),
        "mission_survived": rate([r.mission_ok for r in reports]),
        "memo_entries_exact": f"{sum(r.memo_exact for r in reports)}/"
                              f"{sum(r.memo_entries for r in reports)}",
        "words_in_full": rate([r.words_ok for r in reports if r.words]),
        "queue_next_pr_exact": rate([r.queue_ok for r in reports]),
        "harness_in_memo": sum(1 for r in reports if r.harness_in_memo),
        "background_inputs": f"{checked['background_condensed']}/{checked['background_inputs']}",
        "survived_all": rate([r.survived for r in reports]),
        "now_position_true": rate([r.now_position == r.true_position for r in reports]),
        "mind_position_true": rate([r.mind_position == r.true_position for r in reports]),
        "avg_compression_moved_over_kept": round(
            sum(r.moved_out / max(1, r.rendered_tokens) for r in reports) / max(1, n), 2),
        "tokens_moved_out_total": sum(r.moved_out for r in reports),
        "final_record_tokens_condensed": reports[-1].record_tokens_before_cut if reports else 0,
        "final_checkpoint_tokens": reports[-1].rendered_tokens if reports else 0,
        "reviews_written": checked["reviews_written"], "reviews_range": checked["reviews_range"],
        "queue_errors": checked["queue_errors"],
        "replies_next_pr": checked["replies_next_pr"],
        "decisions_asked": d.approvals, "approvals_honoured": d.approvals_honoured,
        "re_asked_after_approval": checked["re_asked"], "resolutions_sent": d.resolutions,
        "fallbacks_seen": fallbacks,
        "errors": d.errors, "stopped_reason": d.stopped_reason, "queue_done": d.queue_done,
        "user_messages_lost": checked["lost_user_messages"],
    }


def failures(reports: list[CheckpointReport]) -> list[tuple[CheckpointReport, list[str]]]:
    out = []
    for r in reports:
        why: list[str] = []
        if not r.mission_ok:
            why.append(f"Mission entries lost: {r.mission_lost}")
        if r.memo_exact != r.memo_entries:
            why.append(f"memo entries not byte-exact: {r.memo_problems}")
        if not r.words_ok:
            why.append(f"user's words not in full: {r.words}")
        if not r.queue_ok:
            why.append(f"queue: the first reply after it {r.queue_verdict}")
        if r.harness_in_memo:
            why.append(f"harness in memo: {r.harness_in_memo}")
        if why:
            out.append((r, why))
    return out
