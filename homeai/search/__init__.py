"""Semantic search over the store's collections."""
