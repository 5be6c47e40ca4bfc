"""Long memory's activities: the vault on disk, its search index, rollups, the doctor.

Invariant: every write to the vault goes through `store.Vault` (cards only by ledgered
ADD / SUPERSEDE / NOOP, transcripts only by appending), and every written file is
re-indexed at once. The modules import one another in one direction only: clock and
search under store; cards, rollup and doctor over store; turn over rollup. Which of their
activities a worker runs is listed in `workers.worker`, not discovered here.
"""
