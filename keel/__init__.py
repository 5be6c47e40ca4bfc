"""Keel's command line, client helper and embedded dev stack. Thin: no session logic here."""
