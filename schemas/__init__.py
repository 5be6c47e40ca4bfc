"""Pydantic models and pure rules. No I/O beyond loading the bundled tokenizer file."""
