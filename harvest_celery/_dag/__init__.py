"""DAGs with declarative node compensation — pure: the rules, no I/O.

Owns: the DAG as data (``model``: nodes, definitions, map policies, the compensation envelope),
declaring and checking it (``builder``: ``@dag``, ``DagBuilder``, build-time guards, levels,
preflight), running it and its unwind (``runner``: input resolution, mapped nodes, the DAG unwind
order), the DAG view of the core activity fold (``folds``: ``_core.activities`` plus the
compensation-envelope rule that sorts dispatches into forward and compensation), the run graph
(``graph``) and retry-from-node planning and its guard (``retry``).

May import only the standard library, ``harvest_celery._core.*`` and ``harvest_celery._errors``
(and its own modules, one way: builder → runner → model; graph, retry → folds → model). Never
SQLAlchemy, Celery, FastAPI, ``_store``, ``_payloads``, ``_runtime`` or ``_web``: those import it.
"""
