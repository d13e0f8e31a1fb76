"""Background jobs: APScheduler integration, the indexing pipeline, progress and resume."""
