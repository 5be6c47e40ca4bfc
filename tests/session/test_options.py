"""Every activity option set Keel's workflows use has an end (attempts or an overall
deadline), and a failure no retry can fix ends at the first attempt."""

from __future__ import annotations

from typing import cast

from temporalio.workflow import ActivityConfig

import workflows.options as options
from workflows.options import NEVER_RETRY, record_user_input


def _option_sets() -> dict[str, ActivityConfig]:
    # Found by their shape: the module's option sets, each an ActivityConfig.
    found = {name: cast(ActivityConfig, value) for name, value in vars(options).items()
             if name.isupper() and isinstance(value, dict) and "start_to_close_timeout" in value}
    found["record_user_input(60)"] = record_user_input(60)
    return found


def test_every_step_ends():
    sets = _option_sets()
    assert len(sets) >= 15  # every set in the module, not a few
    for name, opts in sets.items():
        policy = opts["retry_policy"]
        bounded = policy.maximum_attempts > 0 or opts.get("schedule_to_close_timeout")
        assert bounded, f"{name} is retried without end"
        assert opts["start_to_close_timeout"], f"{name} has no attempt timeout"


def test_bad_data_and_programming_errors_are_never_retried():
    for name, opts in _option_sets().items():
        kinds = set(opts["retry_policy"].non_retryable_error_types or [])
        missing = set(NEVER_RETRY) - kinds
        assert not missing, f"{name} retries {sorted(missing)}"
    for kind in ("AttributeError", "TypeError", "ValidationError", "DataError",
                 "UnstorableData", "SeqAbandoned"):
        assert kind in NEVER_RETRY
