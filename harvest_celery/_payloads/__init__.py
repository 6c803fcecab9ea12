"""Payloads: the codec chain (Fernet encryption, key rotation), the payload-store protocol and
the file-system store, the pipeline that encodes and offloads payload-bearing fields, the
erasure rules, and the input digest a second start of an id is compared with (``digest``).

Owns: what a payload looks like at rest. No SQL here (the Postgres payload store is in
``_store.blobs``).
May not import: SQLAlchemy, Celery, FastAPI, ``_store``, ``_runtime``, ``_web``, ``_client``,
``_dag``; only ``_core`` and ``_errors``.
"""
