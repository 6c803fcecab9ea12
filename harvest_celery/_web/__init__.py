"""The HTTP surfaces (the ``api`` extra): the FastAPI app (``app``: auth, error handlers,
routers), its request/response models, the HarvestError→HTTP mapping (``errors``), one router
per concern (``routers``: runs, signals and cancel, operator actions, DAGs, meta) and the
server-rendered pages (``pages``: the DAG run page).

Owns: HTTP shapes only; every action goes through the ``Harvest`` client.
May not import: ``_cli``; it sits above ``_client`` and reads nothing of ``_store`` but its
records.
"""
