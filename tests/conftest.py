"""Hooks for every test directory (unit, integration, faults)."""

from tests.require_services import pytest_runtest_makereport  # noqa: F401  (the HARVEST_REQUIRE_SERVICES switch)
