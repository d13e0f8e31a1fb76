"""Benchmarks that print JSON with named keys."""
