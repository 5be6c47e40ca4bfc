"""Undoing `configure_logging` after a test that called it, so that the tests after it log
as they expect (`undo_configure_logging`); the observability and demo tests call it."""

from __future__ import annotations

import logging

import structlog
from temporalio import activity, workflow


def undo_configure_logging(root_level: int) -> None:
    """Leave logging as the other tests expect it."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == "keel"]:
        root.removeHandler(handler)
    root.setLevel(root_level)
    workflow.logger.workflow_info_on_message = True
    activity.logger.activity_info_on_message = True
    structlog.reset_defaults()
