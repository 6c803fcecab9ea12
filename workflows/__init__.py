"""Example workflows and activities: a three-step order pipeline, the checkout saga and the
fulfillment DAG (``harvest demo`` runs them).

They live at ``workflows/`` in the repository, for reading, and install as
``harvest_celery.examples`` (pyproject's ``package-dir``), so an installed harvest takes no
top-level name of yours: import them as ``harvest_celery.examples``. They show users' code, so they
import only what ``harvest_celery`` exports (``harvest_celery.__all__``) and each other.
"""
