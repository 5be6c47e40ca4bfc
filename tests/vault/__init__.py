"""Long memory's tests: the vault's pure rules (one file per schemas.vault module) and its
activities, workflows and schedules against a real PostgreSQL and Temporal."""
