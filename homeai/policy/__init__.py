"""Workload-class policy: YAML schema, validation, hot swap."""
