"""Alembic migrations of the store (run programmatically at start by ``homeai.store.migrate``)."""
