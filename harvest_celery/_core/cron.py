"""Cron expressions, wrapped so the library can be swapped: this module is the only one that
imports it. Pure.

The library is cronsim (Debian cron semantics, pure Python, no dependencies). Its behaviour at
daylight-saving changes is the rule harvest states (docs/schedules.md), and the unit tests pin it
for Europe/Paris, so a swap that differs fails them:

* a local time that does not exist fires once, at the first valid instant after the gap;
* a local time that occurs twice fires once, at its first occurrence;
* an expression whose hour field is ``*`` follows real time straight through both changes.

harvest takes five fields only: a sixth (seconds) is refused, as are the ``@`` aliases.
"""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

UTC = timezone.utc


class CronError(ValueError):
    """A cron expression harvest cannot take."""


class Cron:
    """A checked five-field expression in an IANA time zone."""

    def __init__(self, expression: str, zone: ZoneInfo) -> None:
        if not isinstance(expression, str):
            raise CronError(f"cron is a string, not {type(expression).__name__}")
        fields = expression.split()
        if len(fields) == 6:
            raise CronError(f"cron {expression!r} has a seconds field: harvest takes five fields")
        if len(fields) != 5:
            raise CronError(f"cron {expression!r} has {len(fields)} fields, not five")
        self.expression = " ".join(fields)
        self.zone = zone
        try:
            next(CronSim(self.expression, datetime(2000, 1, 1, tzinfo=zone)))
        except (CronSimError, StopIteration, ValueError) as exc:
            raise CronError(f"cron {expression!r} is malformed: {exc or 'it never fires'}") from None

    def after(self, instant: datetime) -> datetime:
        """The first tick strictly after ``instant`` (aware), in UTC."""
        local = instant.astimezone(self.zone)
        return next(CronSim(self.expression, local)).astimezone(UTC)
