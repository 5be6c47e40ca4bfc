"""Every metric Keel itself exports, by name, with what it counts: the one list the code
that records them (workflows.metrics, activities.vault.outbox), the alerting rules'
test and the docs read. Pure: names and words only.

Invariant: labels are bounded (Temporal adds namespace, task queue and workflow type; the
labels named here take fixed values), never a session id or any text a caller wrote.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "CHECKPOINTS",
    "COST",
    "ERRORS",
    "KEEL_METRICS",
    "MODEL_CALLS",
    "SESSION_EVENTS",
    "TOKENS",
    "TOOL_CALLS",
    "TOO_LONG",
    "TRANSCRIPTS_DROPPED",
    "TRANSCRIPTS_WAITING",
    "TRANSCRIPTS_WRITTEN",
    "TURNS",
    "TURN_DURATION",
    "Metric",
]


class Metric(NamedTuple):
    name: str
    description: str


TURNS = Metric("keel_turns", "Turns ended, by outcome (answered, failed).")
TURN_DURATION = Metric("keel_turn_duration", "A turn from its start to its reply, "
                       "checkpoints and approvals included (ms).")
MODEL_CALLS = Metric("keel_model_calls", "A turn's model calls the API answered.")
TOOL_CALLS = Metric("keel_tool_calls", "Tool calls the model made in turns.")
TOKENS = Metric("keel_model_tokens", "Tokens as the API counted them, by kind (input: "
                "uncached and cache writes; cached: cache reads; output) and purpose (turn, "
                "checkpoint, rollup).")
COST = Metric("keel_model_cost_microdollars", "What the model calls cost at the worker's "
              "price table, in millionths of a dollar, by purpose.")
CHECKPOINTS = Metric("keel_checkpoints", "Checkpoints, by kind (full, earlier_part, "
                     "moved_without_model) and outcome (stored, failed).")
TOO_LONG = Metric("keel_requests_too_long", "Requests the API refused as too long (the "
                  "ladder made room and asked again).")
SESSION_EVENTS = Metric("keel_session_events", "Session events by type: approvals asked "
                        "and decided, budgets near and reached, interrupts, sub-agents, "
                        "wakeups, checkpoints, errors.")
ERRORS = Metric("keel_errors", "Errors a session told its stream, by where (model, "
                "memory, ...).")
TRANSCRIPTS_WRITTEN = Metric("keel_transcripts_written", "Outbox rows written to the vault "
                             "(a turn's transcript each), by vault queue.")
TRANSCRIPTS_DROPPED = Metric("keel_transcripts_dropped", "Outbox rows that failed for good "
                             "(said to their session; the record keeps the words).")
TRANSCRIPTS_WAITING = Metric("keel_transcripts_waiting", "Outbox rows not yet written to "
                             "the vault.")

KEEL_METRICS: tuple[Metric, ...] = (
    TURNS, TURN_DURATION, MODEL_CALLS, TOOL_CALLS, TOKENS, COST, CHECKPOINTS, TOO_LONG,
    SESSION_EVENTS, ERRORS, TRANSCRIPTS_WRITTEN, TRANSCRIPTS_DROPPED, TRANSCRIPTS_WAITING)
