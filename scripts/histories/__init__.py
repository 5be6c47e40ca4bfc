"""The scenarios `scripts/record_histories.py` records for the replay tests
(tests/session/test_replay.py), one module per concern.

Each runs real sessions on a throwaway embedded stack with the offline model (or, where it
scripts the model, the fake Messages API of tests/fake_anthropic on loopback) and saves each
history as JSON under tests/session/histories/, so replay covers every handler a running
session meets. Each module's docstring lists the scenarios it records and what they cover:

- `common`: the repository's paths and the scenario names the script dispatches on;
- `queue`: the queue (the default) and `history-carry`;
- `agent`: `history-agent-approval`;
- `branch`: `history-branch`, `history-rewind-waits` and `history-rewind-children`;
- `budget`: `history-budget-interrupt` and `history-budget-interrupt-activity`;
- `initiative`: `history-initiative`, `history-initiative-fast`, `history-initiative-ahead`
  and `history-initiative-early` (and their children);
- `files`: `history-attachments`, `history-tool-files`, `history-handback` and
  `history-handback-shown`;
- `limits`: `history-input-limits`, `history-refused-config` and `history-refused-id`.

Re-record only on purpose: a change that breaks replay of the committed histories would
break every running session.
"""
