"""Several devices and machines: engine replicas on Ray behind the one front door (optional extra ``cluster``).

Only ``router`` is imported without Ray; the single-box server never imports this package's Ray parts."""
