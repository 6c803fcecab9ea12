"""One module per scenario; each has ``run(args, dbos) -> dict`` (``dbos``: the DBOS
subprocess's output for that scenario, or an ``{"error": ...}``)."""
