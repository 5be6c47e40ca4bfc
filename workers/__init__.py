"""Worker processes: which workflows and activities run on which task queue."""
