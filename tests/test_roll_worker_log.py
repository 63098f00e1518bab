"""ROLL's CPU cache warning (logged after every worker call) shows once per worker process (`roll` tier)."""
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


def test_cpu_empty_cache_warning_shows_once_per_process(roll_platform_records):
    from roll.platforms import current_platform

    from roll_spotlight.roll.workers import quiet_cpu_cache_warning

    if current_platform.device_type != "cpu":
        pytest.skip("the warning is ROLL's CPU platform's")
    current_platform.empty_cache  # ROLL's clear_memory() asks for it after every worker call
    assert len(roll_platform_records) == 1, "ROLL no longer warns here: drop quiet_cpu_cache_warning"
    quiet_cpu_cache_warning()
    quiet_cpu_cache_warning()  # idempotent: one filter per process
    for _ in range(3):
        assert current_platform.empty_cache is None
    assert len(roll_platform_records) == 2
    assert "'empty_cache'" in roll_platform_records[1] and "once per worker process" in roll_platform_records[1]
