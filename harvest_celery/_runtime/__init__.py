"""The runtime: decision cycles, activity execution, the completion paths and their choice
(``completion``: one statement, inline in the completing worker, or the decision task), the one pre-run claim path (``claim``), the Celery message protocol
(``messages``), Celery tasks and hooks (``celery``), adopted existing tasks (``adopt``), the
sweeper, the shared lease heartbeat, embedded mode's in-process dispatcher (``inline``), the
Prometheus counters, and what a running activity body may ask (``activity_context``).

Owns: everything that runs in a worker process.
May not import: ``_web``, ``_client``, ``_cli``, FastAPI.
"""
