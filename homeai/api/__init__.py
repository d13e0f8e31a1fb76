"""HTTP API (Litestar)."""
