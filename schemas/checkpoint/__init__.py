"""The checkpoint's pure rules: when one starts, what it may hold, how it is checked,
repaired, resolved and rendered. No I/O: the activities and the workflow ask these.

    policy   the room-making ladder, the threshold, anti-thrash and two-failures rules
    budgets  how much each part may hold at a given window
    mind / memo / now / problems   the three documents and their checks
    request  the checkpoint and repair requests, the files the turn may edit
    checks   validate every part, then the fallback table
    prepass  the cheap pre-pass over old tool outputs
    render   what a checkpoint carries and the text that replaces the earlier conversation
"""

from schemas.checkpoint.budgets import CheckpointBudgets, cut_to_tokens
from schemas.checkpoint.checks import (
    CheckpointCheck,
    CheckpointOutcome,
    resolve_checkpoint,
    validate_checkpoint,
)
from schemas.checkpoint.policy import (
    Fit,
    ModelWindow,
    RoomStep,
    RoomTried,
    checkpoint_allowed,
    checkpoint_threshold,
    fit,
    next_step,
)
from schemas.checkpoint.problems import Problem, ProblemKind
from schemas.checkpoint.render import (
    CarriedSkill,
    RecentFiles,
    recent_files,
    record_hint,
    render_checkpoint,
    select_carried_skills,
)
from schemas.checkpoint.request import checkpoint_instruction, repair_request

__all__ = [
    "CarriedSkill",
    "CheckpointBudgets",
    "CheckpointCheck",
    "CheckpointOutcome",
    "Fit",
    "ModelWindow",
    "Problem",
    "ProblemKind",
    "RecentFiles",
    "RoomStep",
    "RoomTried",
    "checkpoint_allowed",
    "checkpoint_instruction",
    "checkpoint_threshold",
    "cut_to_tokens",
    "fit",
    "next_step",
    "recent_files",
    "record_hint",
    "render_checkpoint",
    "repair_request",
    "resolve_checkpoint",
    "select_carried_skills",
    "validate_checkpoint",
]
