"""Removed at merge: the streamed call now lives in `activities.model` (`ModelBackend.stream`);
this name stays only for activities/session.py, which this branch may not edit."""

from activities.model.legacy import stream_message

__all__ = ["stream_message"]
