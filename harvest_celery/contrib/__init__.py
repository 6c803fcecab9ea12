"""Framework integrations, the top layer: ``contrib.django`` (an installable Django app) and
``contrib.flask`` (a Flask extension). Each configures one ``Harvest`` from the framework's
settings, starts workflows inside the framework's transaction when its database is the harvest
database, exposes the ``harvest`` command line through the framework's own (``manage.py
harvest …``, ``flask harvest …``) and answers every ``HarvestError`` with the HTTP API's JSON
body and status (``harvest_celery._errors.http_status``).

Owns: framework glue only; every action goes through the ``Harvest`` client.
May import: anything in the package. Nothing in the package imports it.
"""
