"""The pure core: events, commands, the run lifecycle rules, the registry and retry policy, the
decision engine (replay), the ``WorkflowContext`` (over a port the engine implements), ``Saga``,
the JSON checks at the edges, what may name a run (``ids``), the history timeline, and the one
fold of a run's history into its activities and attempts (``activities``: the run-graph API's
status words, which the DAG view and the console read).

Owns: every rule that decides what a run does next. Stdlib only; deterministic; no I/O.
May not import: SQLAlchemy, Celery, kombu, redis, FastAPI, pydantic, prometheus, nor any other
package of harvest_celery except ``_errors``.
"""
