"""Ingest: validate batches and write them, exactly once, into the store."""
