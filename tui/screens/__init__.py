"""One module per screen: dashboard, policy (with its history modal), jobs, requests."""
