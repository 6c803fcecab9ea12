"""The store: the one seam to the database. Schema and Alembic migrations, the engine and
transactions (``store``, ``tx``), a decision staged as a value before it is written
(``staging``: nothing sent, counted or put before its statement), typed rows out (``records``: never a SQLAlchemy row), the
run-state predicates declared once (``predicates``: their SQL, Core and Python forms), every raw
statement (``sql``; ``pgwrite`` caches the run write's text by shape), the one dialect seam
(``dialect``: SQLite for embedded mode, Postgres), the activity side (``tasks``: claim,
completion, retries, leases), what the sweeper finds due (``sweeps``), every run mutation in
one module (``runs``: signal, cancel, terminate, pause, resume, reset, fork, erase, purge),
starting a run (``starts``: id reuse, concurrent starts, the announcement of a start made in an
application's transaction; ``appconn`` and ``dbapi``: that start on the application's own
SQLAlchemy, psycopg or Django connection), the process's ``LISTEN`` connection (``listener``)
and the Postgres payload store (``blobs``).

Owns: all SQL. What a transaction asks to send is a neutral ``Dispatch`` record.
May not import: Celery, kombu, redis, FastAPI, pydantic, ``_runtime``, ``_web``, ``_client``,
``_cli``.
"""
