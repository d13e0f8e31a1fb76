"""The model repository: entries under models/, pulling and converting weights."""
