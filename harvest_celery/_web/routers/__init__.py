"""The operator API's endpoints, one module per concern, each a ``router(...)`` factory that
``create_app`` includes in a fixed order (the order of the published OpenAPI paths):

``runs`` start, list, describe and read the history of runs · ``signals`` signal and cancel a
live run · ``operator`` terminate, pause, resume, reset, erase payloads, and purge (the admin
router) · ``dags`` the run graph and retry of a DAG run · ``schedules`` durable schedules ·
``limits`` activity limits · ``queries`` a run's query handlers (a read, though a POST) ·
``updates`` a run's update handlers (validated, then awaited) ·
``meta`` /metrics and /healthz.

The endpoints are module-level functions that take the app's ``Harvest`` as a dependency; the
factories take the app's ``Guard`` because the auth of mutating endpoints is per app.
"""
