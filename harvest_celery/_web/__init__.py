"""The HTTP surfaces (the ``api`` extra): the FastAPI app (``app``), who may call it (``auth``:
the bearer token, the console's signed session cookie and CSRF token), what it refuses before an
endpoint runs and the errors no endpoint names (``hardening``: cross-site mutations, the
request-size and JSON-depth limits, 503 for a database that does not answer, a JSON 500), its
request/response models, the HarvestError→HTTP mapping (``errors``), one router per concern
(``routers``: runs, signals and cancel, operator actions, DAGs, meta), the server-rendered DAG
run page (``pages``) and the web console (``console``, with its files under ``static``).

Owns: HTTP shapes only; every action goes through the ``Harvest`` client.
May not import: ``_cli``; it sits above ``_client`` and reads nothing of ``_store`` but its
records (and ``is_transient``, to tell a database that does not answer).
"""
