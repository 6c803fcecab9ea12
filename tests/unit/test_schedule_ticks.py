"""Nominal ticks, ids, jitter and the firing plan: pure, with a fixed clock."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from harvest_celery._core.schedule import (
    ScheduleSpecError,
    Spec,
    check_name,
    jitter_of,
    manual_id,
    plan,
    tick_id,
)

UTC = timezone.utc


def u(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def paris(cron: str) -> Spec:
    return Spec.checked(cron=cron, timezone="Europe/Paris")


def test_a_local_time_in_the_spring_gap_fires_once_after_it():
    ticks = list(paris("30 2 * * *").ticks(u(2026, 3, 28, 12), u(2026, 3, 29, 23)))
    assert ticks == [u(2026, 3, 29, 1, 0)]


def test_a_repeated_local_time_fires_once_at_its_first_occurrence():
    ticks = list(paris("30 2 * * *").ticks(u(2026, 10, 24, 12), u(2026, 10, 25, 23)))
    assert ticks == [u(2026, 10, 25, 0, 30)]


def test_a_star_hour_follows_real_time_through_the_spring_change():
    # local 02:00-03:00 does not exist on 2026-03-29: 00:00Z-02:00Z is 01:00-04:00 local
    ticks = list(paris("*/5 * * * *").ticks(u(2026, 3, 29, 0, 0), u(2026, 3, 29, 2, 0)))
    assert len(ticks) == 24
    assert all(b - a == timedelta(minutes=5) for a, b in zip(ticks, ticks[1:], strict=False))
    assert not [t for t in ticks if t.astimezone(paris("* * * * *")._cron().zone).hour == 2]


def test_a_star_hour_fires_twelve_times_in_each_pass_of_the_repeated_hour():
    # local 02:00-03:00 happens twice on 2026-10-25: 00:00Z-01:00Z, then 01:00Z-02:00Z
    spec = paris("*/5 * * * *")
    first = list(spec.ticks(u(2026, 10, 24, 23, 59, 59), u(2026, 10, 25, 0, 59, 59)))
    second = list(spec.ticks(u(2026, 10, 25, 0, 59, 59), u(2026, 10, 25, 1, 59, 59)))
    assert len(first) == len(second) == 12
    assert all(
        b - a == timedelta(minutes=5) for a, b in zip(first + second, (first + second)[1:], strict=False)
    )


def test_every_is_anchored_at_the_epoch():
    spec = Spec.checked(every=timedelta(hours=1))
    assert spec.after(u(2026, 12, 1, 2, 17, 3)) == u(2026, 12, 1, 3)
    assert spec.after(u(2026, 12, 1, 3)) == u(2026, 12, 1, 4)


def test_tick_ids():
    assert tick_id("nightly-report", u(2026, 12, 1, 2)) == "nightly-report@20261201T020000Z"
    assert manual_id("nightly-report", "1a2b3c4d") == "nightly-report@manual-1a2b3c4d"
    assert len(manual_id("n").split("@manual-")[1]) == 8


def test_jitter_is_deterministic_and_below_its_bound():
    a = jitter_of("s@20261201T020000Z", 30)
    assert a == jitter_of("s@20261201T020000Z", 30)
    assert timedelta(0) <= a < timedelta(seconds=30)
    assert jitter_of("s@20261201T020000Z", 0) == timedelta(0)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"cron": "61 * * * *"}, "malformed"),
        ({"cron": "0 0 30 2 *"}, "malformed"),
        ({"cron": "* * * * * *"}, "seconds"),
        ({"cron": "* * * *"}, "fields"),
        ({"cron": "* * * * *", "every": 60}, "exactly one"),
        ({}, "exactly one"),
        ({"every": timedelta(0)}, "whole seconds"),
        ({"every": timedelta(seconds=-5)}, "whole seconds"),
        ({"every": timedelta(milliseconds=500)}, "whole seconds"),
        ({"every": timedelta(seconds=1.5)}, "whole seconds"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "unknown timezone"),
        ({"cron": "* * * * *", "timezone": "CET"}, "unknown timezone"),
        ({"every": 60, "timezone": "UTC"}, "timezone applies to cron"),
        ({"every": 60, "jitter": timedelta(seconds=60)}, "jitter"),
        ({"cron": "0,1 * * * *", "jitter": timedelta(seconds=60)}, "jitter"),
    ],
)
def test_bad_specs_are_refused_by_name(kwargs, words):
    with pytest.raises(ScheduleSpecError, match=words):
        Spec.checked(**kwargs)


@pytest.mark.parametrize("name", ["", " ", "a:b", "a/b", "a\x00b", "x" * 181])
def test_bad_names_are_refused(name):
    with pytest.raises(ScheduleSpecError):
        check_name(name)


def test_a_name_of_180_characters_makes_an_id_that_fits():
    assert len(tick_id(check_name("x" * 180), u(2026, 1, 1))) <= 200


EVERY2 = Spec.checked(every=2)


def _plan(**kw):
    args = dict(
        last_tick=u(2026, 1, 1, 0, 0, 0),
        now=u(2026, 1, 1, 0, 0, 20),
        open_run=False,
        buffered=None,
        overlap="allow_all",
        catchup_window=10.0,
        runs=0,
        max_runs=None,
        end_at=None,
    )
    args.update(kw)
    return plan(EVERY2, "s", **args)


def test_catchup_allow_all_fires_each_in_window_tick_and_counts_the_older_missed():
    p = _plan()
    assert p.fire == [u(2026, 1, 1, 0, 0, s) for s in range(10, 21, 2)]
    assert p.missed == 4  # 2, 4, 6, 8
    assert p.last_tick == u(2026, 1, 1, 0, 0, 20) and p.next_tick == u(2026, 1, 1, 0, 0, 22)


def test_catchup_skip_fires_the_oldest_in_window_tick_only():
    p = _plan(overlap="skip")
    assert p.fire == [u(2026, 1, 1, 0, 0, 10)] and p.skipped == 5 and p.missed == 4


def test_catchup_buffer_one_fires_the_oldest_and_buffers_the_next():
    p = _plan(overlap="buffer_one")
    assert p.fire == [u(2026, 1, 1, 0, 0, 10)]
    assert p.buffered == u(2026, 1, 1, 0, 0, 12) and p.skipped == 4


def test_an_open_run_skips_and_a_closed_one_releases_the_buffered_tick():
    assert _plan(overlap="skip", open_run=True, catchup_window=0, now=u(2026, 1, 1, 0, 0, 2)).skipped == 1
    p = _plan(overlap="buffer_one", buffered=u(2026, 1, 1), now=u(2026, 1, 1, 0, 0, 1))
    assert p.fire == [u(2026, 1, 1)] and p.buffered is None


def test_a_zero_window_counts_a_long_outage_missed():
    p = _plan(now=u(2026, 1, 1, 1), catchup_window=0)
    assert p.fire == [u(2026, 1, 1, 0, 59, 56), u(2026, 1, 1, 0, 59, 58), u(2026, 1, 1, 1)]
    assert p.missed == 1800 - 3


def test_a_tick_due_during_a_long_pass_is_on_time_however_late_its_row_comes():
    # the pass began at :20 and reaches this row at :40 (a burst of rows ahead of it): the ticks
    # from :20 on waited for the pass only, not for a scheduler to come back
    p = _plan(
        last_tick=u(2026, 1, 1, 0, 0, 18),
        catchup_window=0,
        now=u(2026, 1, 1, 0, 0, 40),
        seen=u(2026, 1, 1, 0, 0, 20),
    )
    assert p.fire == [u(2026, 1, 1, 0, 0, s) for s in range(20, 41, 2)] and p.missed == 0
    assert p.lateness[0] == 20.0  # how late it really fired is still reported


def test_a_tick_due_before_the_pass_began_is_judged_from_the_pass_start():
    p = _plan(
        last_tick=u(2026, 1, 1), catchup_window=0, now=u(2026, 1, 1, 0, 0, 40), seen=u(2026, 1, 1, 0, 0, 20)
    )
    assert p.missed == 7  # 2 … 14: more than 5 s due when the pass began (an outage)
    assert p.fire[0] == u(2026, 1, 1, 0, 0, 16) and len(p.fire) == 13


def test_max_runs_and_end_at_end_the_schedule():
    p = _plan(max_runs=2)
    assert len(p.fire) == 2 and p.next_tick is None
    p = _plan(end_at=u(2026, 1, 1, 0, 0, 14))
    assert p.fire[-1] == u(2026, 1, 1, 0, 0, 14) and p.next_tick is None


def test_a_tick_not_yet_past_its_jitter_waits():
    spec = Spec.checked(every=60, jitter=timedelta(seconds=59))
    delay = jitter_of(tick_id("s", u(2026, 1, 1, 0, 1)), 59)
    kw = dict(
        open_run=False, buffered=None, overlap="skip", catchup_window=0, runs=0, max_runs=None, end_at=None
    )
    early = plan(spec, "s", last_tick=u(2026, 1, 1), now=u(2026, 1, 1, 0, 1) + delay / 2, **kw)
    late = plan(spec, "s", last_tick=u(2026, 1, 1), now=u(2026, 1, 1, 0, 1) + delay, **kw)
    assert (early.fire, late.fire) == ([], [u(2026, 1, 1, 0, 1)])
