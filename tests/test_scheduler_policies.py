"""Misfire and overlap policies across downtime, with exact expected fire lists (virtual clock)."""

from __future__ import annotations

from typing import Any

import pytest

from taskkernel.scheduler import ScheduleError, SchedulerException, simulate

DAY = "2026-10-30T"


def t(hhmm: str) -> str:
    return f"{DAY}{hhmm}:00Z"


def run(schedule: dict[str, Any], down: list[list[str]] | None = None, *, start: str = "00:00", end: str = "08:00",
        processes: int = 1, run_for: str | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"schedule": schedule, "from": t(start), "to": t(end), "down": down or [],
                           "processes": processes}
    if run_for:
        doc["run_for"] = run_for
    return simulate(doc)


def fired(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f["nominal"][11:16], f["fired_at"][11:16]) for f in result["fired"]]


def missed(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["nominal"][11:16], m["reason"]) for m in result["missed"]]


HOURLY = {"cron": "0 * * * *", "tz": "UTC"}
DOWN = [[t("02:30"), t("05:30")]]  # misses 03:00, 04:00, 05:00; back 2.5h, 1.5h, 0.5h late
ON_TIME = [("00:00", "00:00"), ("01:00", "01:00"), ("02:00", "02:00")]
AFTER = [("06:00", "06:00"), ("07:00", "07:00"), ("08:00", "08:00")]


@pytest.mark.parametrize("processes", [1, 3])
def test_skip_records_every_late_occurrence_missed(processes: int) -> None:
    r = run({**HOURLY, "misfire": "skip"}, DOWN, processes=processes)
    assert fired(r) == ON_TIME + AFTER
    assert missed(r) == [("03:00", "misfire"), ("04:00", "misfire"), ("05:00", "misfire")]


@pytest.mark.parametrize("processes", [1, 2])
def test_latest_once_runs_the_newest_within_the_window(processes: int) -> None:
    r = run({**HOURLY, "misfire": "latest_once", "catchup_window": "1h"}, DOWN, processes=processes)
    assert fired(r) == ON_TIME + [("05:00", "05:30")] + AFTER
    assert missed(r) == [("03:00", "misfire"), ("04:00", "misfire")]


def test_latest_once_with_a_window_shorter_than_the_delay_runs_nothing_late() -> None:
    r = run({**HOURLY, "misfire": "latest_once", "catchup_window": "10m"}, DOWN)
    assert fired(r) == ON_TIME + AFTER
    assert missed(r) == [("03:00", "misfire"), ("04:00", "misfire"), ("05:00", "misfire")]


def test_latest_once_is_the_default_with_a_one_hour_window() -> None:
    assert run(HOURLY, DOWN) == run({**HOURLY, "misfire": "latest_once", "catchup_window": "1h"}, DOWN)


def test_all_catches_up_every_occurrence_within_the_window_oldest_first() -> None:
    r = run({**HOURLY, "misfire": "all", "catchup_window": "4h"}, DOWN)
    assert fired(r) == ON_TIME + [("03:00", "05:30"), ("04:00", "05:30"), ("05:00", "05:30")] + AFTER
    assert missed(r) == []


def test_all_is_bounded_by_the_window() -> None:
    r = run({**HOURLY, "misfire": "all", "catchup_window": "2h"}, DOWN)
    assert fired(r) == ON_TIME + [("04:00", "05:30"), ("05:00", "05:30")] + AFTER
    assert missed(r) == [("03:00", "misfire")]


def test_all_is_bounded_by_catchup_max() -> None:
    r = run({**HOURLY, "misfire": "all", "catchup_window": "4h", "catchup_max": 2}, DOWN)
    assert fired(r) == ON_TIME + [("03:00", "05:30"), ("04:00", "05:30")] + AFTER
    assert missed(r) == [("05:00", "misfire")]


def test_within_grace_is_on_time_under_every_policy() -> None:
    down = [[t("02:59"), "2026-10-30T03:00:30Z"]]
    r = run({**HOURLY, "misfire": "skip", "grace": "60s"}, down, end="04:00")
    assert [f["fired_at"] for f in r["fired"] if f["nominal"] == t("03:00")] == ["2026-10-30T03:00:30Z"]
    r = run({**HOURLY, "misfire": "skip", "grace": "10s"}, down, end="04:00")
    assert missed(r) == [("03:00", "misfire")]


def test_several_down_windows() -> None:
    down = [[t("00:30"), t("01:10")], [t("03:50"), t("06:20")]]
    r = run({**HOURLY, "misfire": "latest_once", "catchup_window": "1h"}, down)
    assert fired(r) == [("00:00", "00:00"), ("01:00", "01:10"), ("02:00", "02:00"), ("03:00", "03:00"),
                        ("06:00", "06:20"), ("07:00", "07:00"), ("08:00", "08:00")]
    assert missed(r) == [("04:00", "misfire"), ("05:00", "misfire")]


def test_downtime_over_the_whole_range_fires_nothing_late_beyond_the_policy() -> None:
    r = run({"every": "10m", "misfire": "latest_once", "catchup_window": "1h"}, [[t("00:05"), t("07:00")]])
    late = [f for f in fired(r) if f[0] != f[1]]
    assert late == [("07:00", "07:00")] or late == []
    assert sum(1 for m in missed(r) if m[1] == "misfire") == 6 * 7 - 1  # 00:10 .. 06:50 missed


# -- overlap ---------------------------------------------------------------------------------------

EVERY_10 = {"every": "10m", "tz": "UTC"}


def test_overlap_skip_misses_occurrences_while_one_runs() -> None:
    r = run({**EVERY_10, "overlap": "skip"}, end="01:00", run_for="25m")
    assert fired(r) == [("00:10", "00:10"), ("00:40", "00:40")]
    assert missed(r) == [("00:20", "overlap"), ("00:30", "overlap"), ("00:50", "overlap"), ("01:00", "overlap")]


def test_overlap_buffer_one_keeps_one_waiting() -> None:
    r = run({**EVERY_10, "overlap": "buffer_one"}, end="01:00", run_for="25m")
    # 00:10 runs to 00:35; 00:20 waits and starts at 00:35; 00:30 finds one waiting -> missed.
    assert fired(r) == [("00:10", "00:10"), ("00:20", "00:35"), ("00:40", "01:00")]
    assert missed(r) == [("00:30", "overlap"), ("00:50", "overlap")]


def test_overlap_allow_runs_them_concurrently() -> None:
    r = run({**EVERY_10, "overlap": "allow"}, end="01:00", run_for="25m")
    assert fired(r) == [(f"00:{m}0", f"00:{m}0") for m in range(1, 6)] + [("01:00", "01:00")]
    assert missed(r) == []


@pytest.mark.parametrize("idempotent", [False, True])
def test_coordinator_dying_mid_run(idempotent: bool) -> None:
    """Down 5 min into a 20 min run: the lease (60 s) expires. At 00:50 a non-idempotent run is
    abandoned (never repeated) and 00:50 fires; an idempotent one is re-run (attempt 2), so 00:50
    overlaps it and is skipped."""
    r = run({**EVERY_10, "idempotent": idempotent}, [[t("00:15"), t("00:50")]], end="01:30", run_for="20m")
    if idempotent:
        assert fired(r) == [("00:10", "00:10"), ("01:10", "01:10"), ("01:30", "01:30")]
        overlaps = [("00:50", "overlap"), ("01:00", "overlap"), ("01:20", "overlap")]
    else:
        assert fired(r) == [("00:10", "00:10"), ("00:50", "00:50"), ("01:10", "01:10"), ("01:30", "01:30")]
        overlaps = [("01:00", "overlap"), ("01:20", "overlap")]
    assert missed(r) == [("00:20", "misfire"), ("00:30", "misfire"), ("00:40", "misfire")] + overlaps


# -- input validation ------------------------------------------------------------------------------

@pytest.mark.parametrize(("doc", "code"), [
    ({"schedule": {"cron": "* * *"}, "from": t("00:00"), "to": t("01:00")}, ScheduleError.INVALID_SPEC),
    ({"schedule": {"cron": "* * * * *", "every": "1m"}, "from": t("00:00"), "to": t("01:00")},
     ScheduleError.INVALID_SPEC),
    ({"schedule": {"every": "1m", "tz": "Nowhere/City"}, "from": t("00:00"), "to": t("01:00")},
     ScheduleError.INVALID_TIMEZONE),
    ({"schedule": {"every": "1m", "misfire": "sometimes"}, "from": t("00:00"), "to": t("01:00")},
     ScheduleError.INVALID_SPEC),
    ({"schedule": {"every": "1m"}, "from": t("02:00"), "to": t("01:00")}, ScheduleError.INVALID_SIMULATION),
    ({"schedule": {"every": "1m"}, "from": t("00:00")}, ScheduleError.INVALID_SIMULATION),
    ({"schedule": {"every": "1m"}, "from": t("00:00"), "to": t("01:00"), "processes": 0},
     ScheduleError.INVALID_SIMULATION),
    ({"schedule": {"every": "1m"}, "from": t("00:00"), "to": t("01:00"), "down": [[t("00:10")]]},
     ScheduleError.INVALID_SIMULATION),
    ({"schedule": {"every": "1m"}, "from": t("00:00"), "to": t("01:00"), "extra": 1},
     ScheduleError.INVALID_SIMULATION),
    ({"schedule": {"every": "soon"}, "from": t("00:00"), "to": t("01:00")}, ScheduleError.INVALID_DURATION),
])
def test_bad_simulation_input_has_a_stable_code(doc: dict[str, Any], code: ScheduleError) -> None:
    with pytest.raises(SchedulerException) as exc:
        simulate(doc)
    assert exc.value.code is code
    assert exc.value.message
