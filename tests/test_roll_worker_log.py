"""ROLL's CPU cache warning (logged after every worker call) shows once per role, from rank 0 (`roll` tier)."""
from __future__ import annotations

import logging

import pytest

pytestmark = pytest.mark.roll


@pytest.fixture
def roll_platform_records(tmp_path, monkeypatch):
    """What ROLL's platform logger emits, with no roll_spotlight filter installed before or after."""
    monkeypatch.chdir(tmp_path)  # ROLL writes ./output/logs on import
    from roll.platforms import platform

    from roll_spotlight.roll.workers import OnceFilter

    class Collect(logging.Handler):
        records: list = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record.getMessage())

    def drop_filters():
        for once in [f for f in platform.logger.filters if isinstance(f, OnceFilter)]:
            platform.logger.removeFilter(once)

    drop_filters()
    handler = Collect()
    platform.logger.addHandler(handler)
    yield handler.records
    platform.logger.removeHandler(handler)
    drop_filters()


def _ask_three_times(rank: int):
    from roll.platforms import current_platform

    from roll_spotlight.roll.workers import quiet_cpu_cache_warning

    if current_platform.device_type != "cpu":
        pytest.skip("the warning is ROLL's CPU platform's")
    quiet_cpu_cache_warning(rank)
    quiet_cpu_cache_warning(rank)  # idempotent: one filter per process
    for _ in range(3):
        assert current_platform.empty_cache is None  # ROLL's clear_memory() asks after every worker call


def test_rolls_cpu_platform_warns_at_every_ask(roll_platform_records):
    from roll.platforms import current_platform

    if current_platform.device_type != "cpu":
        pytest.skip("the warning is ROLL's CPU platform's")
    current_platform.empty_cache, current_platform.empty_cache
    assert len(roll_platform_records) == 2, "ROLL no longer warns here: drop quiet_cpu_cache_warning"


def test_rank_0_shows_rolls_cpu_cache_warning_once(roll_platform_records):
    _ask_three_times(rank=0)
    assert len(roll_platform_records) == 1
    assert "'empty_cache'" in roll_platform_records[0] and "once per role" in roll_platform_records[0]


def test_other_ranks_drop_it(roll_platform_records):
    _ask_three_times(rank=2)
    assert roll_platform_records == []
