"""Everything that touches the world: PostgreSQL, the model, the scratch files, tools."""
