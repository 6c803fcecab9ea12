"""``python -m harvest_celery`` is the ``harvest`` command."""

from __future__ import annotations

import sys

from harvest_celery._cli import main

if __name__ == "__main__":
    sys.exit(main())
