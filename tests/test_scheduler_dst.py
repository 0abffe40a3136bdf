"""Trigger maths: crontab weekdays, Vixie day matching, DST-safe dedup keys (one fire per local day).

The DST cases run the real scheduler through ``simulate`` (virtual clock, real ledger), so they
check what fires, not only what APScheduler computes.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from itertools import islice
from zoneinfo import ZoneInfo

import pytest
from apscheduler.triggers.cron import CronTrigger

from taskkernel.scheduler import (
    ScheduleError,
    SchedulerException,
    build_trigger,
    simulate,
    spec_from_user,
    translate_day_of_week,
)


def fires(cron: str, tz: str, start: str, end: str) -> dict:
    return simulate({"schedule": {"cron": cron, "tz": tz}, "from": start, "to": end})


def local_days(result: dict, tz: str) -> Counter[str]:
    zone = ZoneInfo(tz)
    return Counter(
        datetime.fromisoformat(f["nominal"].replace("Z", "+00:00")).astimezone(zone).date().isoformat()
        for f in result["fired"]
    )


def first_n(expr: str, tz: str, after: datetime, n: int) -> list[datetime]:
    trig = build_trigger(spec_from_user({"cron": expr, "tz": tz}), after)
    return list(islice(trig.iter_after(after), n))


# -- crontab weekdays --------------------------------------------------------------------------------

def test_cron_day_of_week_zero_is_sunday() -> None:
    after = datetime(2026, 11, 30, tzinfo=UTC)  # a Monday
    got = first_n("0 9 * * 0", "UTC", after, 4)
    assert [d.strftime("%a") for d in got] == ["Sun"] * 4
    assert got[0] == datetime(2026, 12, 6, 9, tzinfo=UTC)
    # The trap this guards against: APScheduler 3.x from_crontab reads 0 as Monday.
    aps = CronTrigger.from_crontab("0 9 * * 0", timezone="UTC").get_next_fire_time(None, after)
    assert aps.strftime("%a") == "Mon"


@pytest.mark.parametrize(("field", "names"), [
    ("0", "sun"), ("7", "sun"), ("1-5", "mon,tue,wed,thu,fri"), ("5-7", "sun,fri,sat"),
    ("*/2", "sun,tue,thu,sat"), ("1,3", "mon,wed"), ("sat", "sat"), ("MON-wed", "mon,tue,wed"),
    ("1/3", "mon,thu"), ("*", "*"),
])
def test_day_of_week_translation(field: str, names: str) -> None:
    assert translate_day_of_week(field) == names


@pytest.mark.parametrize("field", ["8", "5-1", "funday", "*/0", "1/x"])
def test_bad_day_of_week_is_invalid_spec(field: str) -> None:
    with pytest.raises(SchedulerException) as exc:
        spec_from_user({"cron": f"0 9 * * {field}"})
    assert exc.value.code is ScheduleError.INVALID_SPEC


def test_weekday_range_fires_monday_to_friday_only() -> None:
    got = first_n("0 9 * * 1-5", "Europe/Berlin", datetime(2026, 11, 28, tzinfo=UTC), 6)
    assert [d.astimezone(ZoneInfo("Europe/Berlin")).strftime("%a") for d in got] == [
        "Mon", "Tue", "Wed", "Thu", "Fri", "Mon"]


def test_day_of_month_and_weekday_both_restricted_means_either() -> None:
    # Vixie cron: "on the 13th, and on every Friday". APScheduler alone would need both.
    got = first_n("0 9 13 * 5", "UTC", datetime(2026, 12, 1, tzinfo=UTC), 6)
    assert [d.date().isoformat() for d in got] == [
        "2026-12-04", "2026-12-11", "2026-12-13", "2026-12-18", "2026-12-25", "2027-01-01"]


def test_macros_and_field_count() -> None:
    assert first_n("@daily", "UTC", datetime(2026, 1, 1, 12, tzinfo=UTC), 1) == [datetime(2026, 1, 2, tzinfo=UTC)]
    with pytest.raises(SchedulerException) as exc:
        spec_from_user({"cron": "0 9 * *"})
    assert exc.value.code is ScheduleError.INVALID_SPEC


# -- DST: exactly one fire per local day ------------------------------------------------------------

NY = "America/New_York"

DST_CASES = [
    # (cron, zone, from, to, expected fired nominal instants, expected duplicates)
    pytest.param("30 1 * * *", NY, "2026-03-06T00:00:00Z", "2026-03-10T12:00:00Z",
                 ["2026-03-06T06:30:00Z", "2026-03-07T06:30:00Z", "2026-03-08T06:30:00Z",
                  "2026-03-09T05:30:00Z", "2026-03-10T05:30:00Z"], [], id="NY-spring-01:30"),
    pytest.param("30 2 * * *", NY, "2026-03-06T00:00:00Z", "2026-03-10T12:00:00Z",
                 # 02:30 does not exist on 03-08: it fires once, at the shifted instant 03:30 EDT.
                 ["2026-03-06T07:30:00Z", "2026-03-07T07:30:00Z", "2026-03-08T07:30:00Z",
                  "2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"], [], id="NY-spring-02:30"),
    pytest.param("30 1 * * *", NY, "2026-10-30T00:00:00Z", "2026-11-03T12:00:00Z",
                 # 01:30 happens twice on 11-01; the second (EST) one has the same key.
                 ["2026-10-30T05:30:00Z", "2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z",
                  "2026-11-02T06:30:00Z", "2026-11-03T06:30:00Z"], ["2026-11-01T06:30:00Z"], id="NY-fall-01:30"),
    pytest.param("30 2 * * *", NY, "2026-10-30T00:00:00Z", "2026-11-03T12:00:00Z",
                 ["2026-10-30T06:30:00Z", "2026-10-31T06:30:00Z", "2026-11-01T07:30:00Z",
                  "2026-11-02T07:30:00Z", "2026-11-03T07:30:00Z"], [], id="NY-fall-02:30"),
    pytest.param("30 2 * * *", "Europe/Berlin", "2026-03-28T00:00:00Z", "2026-03-30T12:00:00Z",
                 ["2026-03-28T01:30:00Z", "2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z"], [],
                 id="Berlin-spring-02:30"),
    pytest.param("30 2 * * *", "Europe/Berlin", "2026-10-24T00:00:00Z", "2026-10-26T12:00:00Z",
                 ["2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
                 ["2026-10-25T01:30:00Z"], id="Berlin-fall-02:30"),
    pytest.param("45 1 * * *", "Australia/Lord_Howe", "2026-04-03T00:00:00Z", "2026-04-06T00:00:00Z",
                 # 30-minute shift: 01:30-02:00 repeats on 04-05 (local).
                 ["2026-04-03T14:45:00Z", "2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"],
                 ["2026-04-04T15:15:00Z"], id="LordHowe-fall-01:45"),
    pytest.param("15 2 * * *", "Australia/Lord_Howe", "2026-10-02T00:00:00Z", "2026-10-05T00:00:00Z",
                 # 02:00-02:30 does not exist on 10-04 (local): fires at the shifted instant 02:45.
                 ["2026-10-02T15:45:00Z", "2026-10-03T15:45:00Z", "2026-10-04T15:15:00Z"], [],
                 id="LordHowe-spring-02:15"),
]


@pytest.mark.parametrize(("cron", "tz", "start", "end", "expected", "duplicates"), DST_CASES)
def test_dst_exactly_one_fire_per_local_day(cron: str, tz: str, start: str, end: str, expected: list[str],
                                            duplicates: list[str]) -> None:
    result = fires(cron, tz, start, end)
    assert [f["nominal"] for f in result["fired"]] == expected
    assert [f["fired_at"] for f in result["fired"]] == expected  # coordinator up: on time
    assert set(local_days(result, tz).values()) == {1}
    assert [(m["nominal"], m["reason"]) for m in result["missed"]] == [(d, "duplicate") for d in duplicates]
    keys = [f["dedup_key"] for f in result["fired"]]
    assert len(keys) == len(set(keys))


def test_fall_back_duplicate_shares_the_wall_clock_key() -> None:
    result = fires("30 1 * * *", NY, "2026-11-01T00:00:00Z", "2026-11-01T12:00:00Z")
    assert result == {
        "fired": [{"dedup_key": "2026-11-01T01:30", "nominal": "2026-11-01T05:30:00Z",
                   "fired_at": "2026-11-01T05:30:00Z"}],
        "missed": [{"dedup_key": "2026-11-01T01:30", "nominal": "2026-11-01T06:30:00Z", "reason": "duplicate"}],
    }


def test_spring_forward_key_is_the_shifted_wall_minute() -> None:
    result = fires("30 2 * * *", NY, "2026-03-08T00:00:00Z", "2026-03-08T12:00:00Z")
    assert result["fired"] == [{"dedup_key": "2026-03-08T03:30", "nominal": "2026-03-08T07:30:00Z",
                                "fired_at": "2026-03-08T07:30:00Z"}]


def test_sub_daily_cron_trades_one_fall_back_fire_for_no_double_fire() -> None:
    # Documented trade-off: "30 * * * *" fires 24 times on the 25-hour night, not 25.
    result = fires("30 * * * *", NY, "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z")
    assert len(result["fired"]) == 24
    assert [m["reason"] for m in result["missed"]] == ["duplicate"]


def test_elapsed_dst_mode_keys_by_utc_and_fires_every_hour() -> None:
    result = simulate({"schedule": {"cron": "30 * * * *", "tz": NY, "dst": "elapsed"},
                       "from": "2026-11-01T04:00:00Z", "to": "2026-11-02T05:00:00Z"})
    assert len(result["fired"]) == 25 and result["missed"] == []
    assert result["fired"][0]["dedup_key"] == "2026-11-01T04:30:00Z"


def test_interval_is_elapsed_time_across_dst() -> None:
    result = simulate({"schedule": {"every": "6h", "tz": NY}, "from": "2026-11-01T00:00:00Z",
                       "to": "2026-11-02T00:00:00Z"})
    assert [f["nominal"] for f in result["fired"]] == [
        "2026-11-01T06:00:00Z", "2026-11-01T12:00:00Z", "2026-11-01T18:00:00Z", "2026-11-02T00:00:00Z"]
    assert result["fired"][0]["dedup_key"] == "2026-11-01T06:00:00Z"


def test_calendar_interval_skips_a_nonexistent_local_time() -> None:
    # APScheduler's CalendarIntervalTrigger skips a day whose time does not exist (documented).
    result = simulate({"schedule": {"calendar": "days=1, hour=2, minute=30", "tz": NY,
                                    "start": "2026-03-06"},
                       "from": "2026-03-06T00:00:00Z", "to": "2026-03-10T12:00:00Z"})
    assert [f["dedup_key"] for f in result["fired"]] == [
        "2026-03-06T02:30", "2026-03-07T02:30", "2026-03-09T02:30", "2026-03-10T02:30"]


def test_date_fires_once() -> None:
    result = simulate({"schedule": {"at": "2026-11-01T01:30", "tz": NY}, "from": "2026-10-31T00:00:00Z",
                       "to": "2026-11-03T00:00:00Z"})
    assert result == {"fired": [{"dedup_key": "2026-11-01T05:30:00Z", "nominal": "2026-11-01T05:30:00Z",
                                 "fired_at": "2026-11-01T05:30:00Z"}], "missed": []}


def test_jitter_is_deterministic_and_bounded() -> None:
    spec = spec_from_user({"every": "1h", "jitter": "10m"})
    a = build_trigger(spec, datetime(2026, 1, 1, tzinfo=UTC), "sch_x")
    b = build_trigger(spec, datetime(2026, 1, 1, tzinfo=UTC), "sch_x")
    nominals = list(islice(a.iter_after(datetime(2026, 1, 1, tzinfo=UTC)), 50))
    delays = [a.due(n) - n for n in nominals]
    assert delays == [b.due(n) - n for n in nominals]
    assert all(0 <= d.total_seconds() <= 600 for d in delays)
    assert len(set(delays)) > 10  # actually spread, not a constant offset
