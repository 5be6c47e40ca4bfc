"""What the scenarios and the script share: the repository's root, the directory the
histories are saved in (tests/session/histories/; each file named by its workflow id, which
the replay test reads from the name, `NAME@RUN.json` for one of several runs), and the
scenario names `scripts/record_histories.py` dispatches on (any other NAME records the
queue, scripts.histories.queue).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "session" / "histories"
AGENT_SCENARIO = "history-agent-approval"
CARRY_SCENARIO = "history-carry"
BRANCH_SCENARIO = "history-branch"
BUDGET_SCENARIO = "history-budget-interrupt"
BUDGET_SCENARIOS = (BUDGET_SCENARIO, "history-budget-interrupt-activity")
LIMITS_SCENARIO = "history-input-limits"
ATTACHMENTS_SCENARIO = "history-attachments"
TOOL_FILES_SCENARIO = "history-tool-files"
HANDBACK_SCENARIO = "history-handback"
HANDBACK_SHOWN_SCENARIO = "history-handback-shown"
REFUSED_SCENARIO = "history-refused-config"
REFUSED_ID_SCENARIO = "history-refused-id"  # saved as `_history-refused-id.json`
INITIATIVE_SCENARIO = "history-initiative"
EARLY_SCENARIO = "history-initiative-early"
INITIATIVE_SCENARIOS = (INITIATIVE_SCENARIO, "history-initiative-fast",
                        "history-initiative-ahead", EARLY_SCENARIO)
REWIND_SCENARIO = "history-rewind-waits"
REWIND_CHILDREN_SCENARIO = "history-rewind-children"
