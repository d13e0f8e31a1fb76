"""Persistence (SQLAlchemy 2, async): users, API keys, policy versions. Never on the token hot path."""
