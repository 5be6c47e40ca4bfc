"""A session's events as a person reads them in a terminal (`keel send --wait`, `keel chat`,
`keel tail`): the reply as it streams, one line per tool call, result, background input,
recall, checkpoint, error; a footer after each reply.

Invariants: this module only renders; it decides nothing about the session. The record is
the truth: streamed text that a retried model call restarts, or deltas that never arrived,
are mended from the turn's end (`TurnEnded.reply_preview`) or the caller's `TurnOutcome`,
so the person always ends up seeing the reply the record keeps. A checkpoint is one dim
line, never an interruption.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from keel.console import one_line
from keel.events import EventsMissed
from schemas.events import (
    CUT_MARK,
    MODEL_RETRYING,
    ApprovalDecided,
    ApprovalNeeded,
    BudgetAnswered,
    BudgetNear,
    BudgetReached,
    CheckpointFailed,
    CheckpointStarted,
    CheckpointStored,
    ErrorEvent,
    InputRecorded,
    RecallFound,
    SessionEnded,
    SessionEvent,
    SessionStopped,
    TextDelta,
    ToolCalled,
    ToolResult,
    TurnEnded,
    TurnInterrupted,
    TurnStarted,
)
from schemas.messages import stop_note
from schemas.model import OFFLINE_MODEL_NAME
from schemas.session import TurnOutcome

KIND_LABEL = {"moved_without_model": "moved without the model", "earlier_part": "earlier part",
              "full": "full"}


def model_label(model: str | None) -> str:
    if model == OFFLINE_MODEL_NAME:
        return f"offline deterministic model ({OFFLINE_MODEL_NAME})"
    return model or "?"


def footer(ended: TurnEnded) -> str | None:
    """Context use, where the checkpoint starts, how much of the turn's input the prompt
    cache held (and how long it keeps it now), the model: one dim line."""
    if not ended.context_window or ended.context_tokens is None:
        return None
    pct = 100 * ended.context_tokens / max(1, ended.context_window)
    at = (f" · checkpoint at {ended.checkpoint_threshold:,}"
          if ended.checkpoint_threshold else "")
    billed = (ended.cached_tokens or 0) + (ended.uncached_tokens or 0)
    cache = ""
    if billed:  # the offline model caches as the API does (activities.offline.cache)
        kept = f", kept {ended.cache_ttl}" if ended.cache_ttl else ""
        cache = f" · cache {100 * (ended.cached_tokens or 0) / billed:.0f}% read{kept}"
    return (f"context {pct:.0f}% ({ended.context_tokens:,} / {ended.context_window:,})"
            f"{at}{cache} · {model_label(ended.model)}")


class LiveView:
    """Prints events as they come; remembers enough to end every reply cleanly."""

    def __init__(self, console: Console, *, whole_turns: bool = False) -> None:
        self.console = console
        # Show only turns this view saw start (a chat or `send --wait` joining mid-turn
        # leaves that turn's tail out); `keel tail --from` shows whatever it is given.
        self.whole_turns = whole_turns
        self.paused = False  # events are kept back (and shown on `resume`) meanwhile
        self._held: list[tuple[int, SessionEvent | EventsMissed]] = []
        self.mid_line = False  # a reply's text is being written on the current line
        self.streamed: dict[int, str] = {}  # reply_seq -> text shown so far
        self.attempts: dict[int, int] = {}
        self.ended: dict[int, TurnEnded] = {}  # turn -> its end
        self.turn_inputs: dict[int, list[int]] = {}  # turn -> the seqs it answers
        self.last_offset = -1
        self.finished = False  # session_ended seen
        self.errors_shown: set[tuple[int | None, str]] = set()  # (turn, line) printed

    # ----- output helpers -------------------------------------------------------------------

    def _line(self, markup: str) -> None:
        if self.mid_line:
            self.console.print()
            self.mid_line = False
        self.console.print(markup, highlight=False, soft_wrap=True)

    def _text(self, reply_seq: int, text: str) -> None:
        if not self.mid_line:
            self.console.print("[bold green]keel[/]: ", end="", highlight=False)
            self.mid_line = True
        self.console.print(escape(text), end="", highlight=False, soft_wrap=True)
        self.streamed[reply_seq] = self.streamed.get(reply_seq, "") + text

    # ----- events ---------------------------------------------------------------------------

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        held, self._held = self._held, []
        for offset, event in held:
            self.show(offset, event)

    def show(self, offset: int, event: SessionEvent | EventsMissed) -> None:
        if self.paused:
            self._held.append((offset, event))
            return
        self.last_offset = max(self.last_offset, offset)
        turn = getattr(event, "turn", None)
        if (self.whole_turns and turn is not None and turn not in self.turn_inputs
                and not isinstance(event, TurnStarted | InputRecorded | SessionStopped
                                   | SessionEnded)):
            return
        handler = getattr(self, f"_on_{type(event).__name__}", None)
        if handler is not None:
            handler(event)

    def _on_EventsMissed(self, e: EventsMissed) -> None:
        self._line(f"[dim]({e.missed_to - e.missed_from} earlier events are no longer in the "
                   "stream; `keel record` has what is durable)[/]")

    def _on_InputRecorded(self, e: InputRecorded) -> None:
        files = f" with {', '.join(e.files)}" if e.files else ""
        if e.source_line and e.kind != "user":
            self._line(f"[yellow]{escape(e.source_line)}[/] [dim]#{e.seq}[/]")
        elif not self.whole_turns:  # a chat shows the person's words already; tail does not
            self._line(f"[dim]{escape(e.kind)} input #{e.seq}{escape(files)}[/]")

    def _on_TurnStarted(self, e: TurnStarted) -> None:
        if e.turn is not None:
            self.turn_inputs[e.turn] = list(e.input_seqs)

    def _on_TextDelta(self, e: TextDelta) -> None:
        seen = self.streamed.get(e.reply_seq, "")
        if e.attempt != self.attempts.setdefault(e.reply_seq, e.attempt):
            # The model call was retried and streams again from its start.
            self.attempts[e.reply_seq] = e.attempt
            if seen:
                self._line("[dim](the model call was retried; the reply again:)[/]")
            self.streamed[e.reply_seq] = seen = ""
        if e.start > len(seen):  # some deltas never arrived: the end mends it
            return
        self._text(e.reply_seq, e.text[len(seen) - e.start:])

    def _on_ToolCalled(self, e: ToolCalled) -> None:
        self._line(f"[cyan]→ {escape(e.name)}[/] [dim]{escape(one_line(e.input, 120))}[/]")

    def _on_ToolResult(self, e: ToolResult) -> None:
        colour = "red" if e.is_error else "dim"
        self._line(f"[{colour}]← {escape(e.name)}: {escape(one_line(e.output, 120))}[/]")

    def _on_RecallFound(self, e: RecallFound) -> None:
        sources = ", ".join(e.sources[:3]) + (" …" if len(e.sources) > 3 else "")
        self._line(f"[dim]recalled {e.hits} from long memory: {escape(sources)}[/]")

    def _on_CheckpointStarted(self, e: CheckpointStarted) -> None:
        self._line(f"[dim]checkpoint: condensing {e.tokens_before:,} tokens…[/]")

    def _on_CheckpointStored(self, e: CheckpointStored) -> None:
        extra = f"; fallbacks: {', '.join(e.fallbacks)}" if e.fallbacks else ""
        self._line(f"[dim]checkpoint stored ({KIND_LABEL.get(e.kind.value, e.kind.value)}): "
                   f"{e.tokens_before:,} → {e.tokens_after:,} tokens{escape(extra)}[/]")

    def _on_CheckpointFailed(self, e: CheckpointFailed) -> None:
        self._line(f"[dim yellow]checkpoint failed: {escape(one_line(e.reason, 160))}[/]")

    def _on_ApprovalNeeded(self, e: ApprovalNeeded) -> None:
        self._line(f"[yellow]approval needed[/] {escape(e.approval_id)}: {escape(e.tool)} "
                   f"{escape(one_line(e.summary, 120))}{self._approve_hint(e)}")

    def _approve_hint(self, e: ApprovalNeeded) -> str:
        """How to answer, where this view cannot ask (keel.cli.waiting.ChatView asks)."""
        return (f"; the turn waits: keel approve {escape(e.session_id)} "
                f"{escape(e.approval_id)}, or keel deny")

    def _on_ApprovalDecided(self, e: ApprovalDecided) -> None:
        verdict = "approved" if e.approved else "denied"
        self._line(f"[dim]{escape(e.approval_id)} {verdict} by {escape(e.by)}[/]")

    def _on_BudgetReached(self, e: BudgetReached) -> None:
        self._line(f"[yellow]budget reached[/] ({escape(e.scope)}: {escape(e.reached)})"
                   f"{self._budget_hint(e)}")

    def _budget_hint(self, e: BudgetReached) -> str:
        return (f": the turn waits; keel budget {escape(e.session_id)} --again, --raise "
                "AMOUNT or --refuse")

    def _on_BudgetNear(self, e: BudgetNear) -> None:
        self._line(f"[yellow]budget {e.share:.0%} spent[/] ({escape(e.scope)}: "
                   f"{escape(e.said)}); at the limit the turn waits for a raise")

    def _on_BudgetAnswered(self, e: BudgetAnswered) -> None:
        self._line(f"[dim]budget {'raised' if e.raised else 'not raised'} by "
                   f"{escape(e.by)}[/]")

    def _on_TurnInterrupted(self, e: TurnInterrupted) -> None:
        self._line("[dim]interrupting the turn[/]")

    def _error(self, turn: int | None, message: str) -> None:
        """A turn's error, once: the error event, the turn's end and the outcome carry the
        same (each cut to its own length: compared as printed)."""
        shown = one_line(message, 300)
        if (turn, shown) not in self.errors_shown:
            self.errors_shown.add((turn, shown))
            self._line(f"[red]{escape(shown)}[/]")

    def _on_ErrorEvent(self, e: ErrorEvent) -> None:
        if e.where == MODEL_RETRYING:  # the turn goes on: said, not as its failure
            self._line(f"[yellow]{escape(one_line(e.message, 300))}[/]")
            return
        self._error(e.turn, e.message)

    def _on_SessionStopped(self, e: SessionStopped) -> None:
        self._line(f"[yellow]{escape(e.reason)}[/]")

    def _on_SessionEnded(self, e: SessionEnded) -> None:
        self.finished = True
        self._line("[dim]the session has ended[/]")

    def _on_TurnEnded(self, e: TurnEnded) -> None:
        if e.turn is not None:
            self.ended[e.turn] = e
        if e.reply_seq is not None:
            self._mend(e.reply_seq, e.reply_preview, e.reply_chars)
        if e.error:
            self._error(e.turn, e.error)
        if note := stop_note(e.stop_reason):
            self._line(f"[yellow]({escape(note)})[/]")
        if self.mid_line:
            self.console.print()
            self.mid_line = False
        if (line := footer(e)) is not None:
            self.console.print(f"[dim]{escape(line)}[/]", highlight=False)

    def _mend(self, reply_seq: int, text: str, total: int) -> None:
        """Make what was shown of a reply equal to the reply (as far as `text` goes: the
        turn's end carries its first PREVIEW_CHARS, cut with a mark when it goes on, and a
        stream that brought more than that agrees with it)."""
        seen = self.streamed.get(reply_seq, "")
        cut_off = total > len(text) and text.endswith(CUT_MARK)
        known = text[:-len(CUT_MARK)] if cut_off else text
        if known.startswith(seen):
            if len(known) > len(seen):
                self._text(reply_seq, known[len(seen):])
        elif known and not (cut_off and seen.startswith(known)):
            self._line("[dim](the streamed text differs from the reply; the reply:)[/]")
            self.streamed[reply_seq] = ""
            self._text(reply_seq, known)
        if total > len(self.streamed.get(reply_seq, "")) and not self.streamed.get(
                reply_seq, "").endswith(CUT_MARK):
            self._text(reply_seq, CUT_MARK)

    # ----- the caller's outcome -------------------------------------------------------------

    def outcome_shown(self, outcome: TurnOutcome) -> bool:
        return outcome.turn in self.ended

    def show_outcome(self, outcome: TurnOutcome) -> None:
        """What the events did not show of a turn the caller waited for."""
        if outcome.reply_seq is not None and outcome.reply_text:
            seen = self.streamed.get(outcome.reply_seq, "")
            if outcome.reply_text.startswith(seen):  # what the stream did not bring
                if len(outcome.reply_text) > len(seen):
                    self._text(outcome.reply_seq, outcome.reply_text[len(seen):])
            elif seen != outcome.reply_text:  # deltas lost and the preview cut: all of it
                self._line("[dim](the whole reply:)[/]")
                self.streamed[outcome.reply_seq] = ""
                self._text(outcome.reply_seq, outcome.reply_text)
        if self.mid_line:
            self.console.print()
            self.mid_line = False
        if outcome.turn not in self.ended:
            if outcome.error:
                self._error(outcome.turn, outcome.error)
            if outcome.stopped_reason and outcome.stopped_reason != outcome.error:
                self._line(f"[yellow]{escape(outcome.stopped_reason)}[/]")
            if note := stop_note(outcome.stop_reason):
                self._line(f"[yellow]({escape(note)})[/]")


def event_dict(offset: int, event: Any) -> dict[str, Any]:
    """An event as one JSON object for `keel tail --json`: its offset, then its fields."""
    return {"offset": offset, **event.model_dump(mode="json")}
