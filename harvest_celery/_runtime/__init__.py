"""The runtime: decision cycles (inline in the completing worker, or the decision task),
activity execution, the one pre-run claim path (``claim``), the Celery message protocol
(``messages``), Celery tasks and hooks (``celery``), adopted existing tasks (``adopt``), the
sweeper, the shared lease heartbeat, embedded mode's in-process dispatcher (``inline``) and the
Prometheus counters.

Owns: everything that runs in a worker process.
May not import: ``_web``, ``_client``, ``_cli``, FastAPI.
"""
