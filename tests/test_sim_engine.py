"""Tier 1: the discrete-event engine is deterministic and ordered."""
from roll_spotlight.sim.events import PRIORITY_MARKET, EventLoop


def _trace_of(schedule_order):
    loop = EventLoop()
    seen = []
    for time_s, name, priority in schedule_order:
        loop.schedule(time_s, seen.append, name, priority=priority)
    loop.run_until()
    return seen


def test_events_run_in_time_then_priority_then_scheduling_order():
    order = [(5.0, "late", 5), (1.0, "a", 5), (1.0, "b", 5), (1.0, "market", PRIORITY_MARKET), (0.5, "first", 5)]
    assert _trace_of(order) == ["first", "market", "a", "b", "late"]


def test_same_inputs_same_trace():
    order = [(float(i % 7), f"e{i}", i % 3) for i in range(50)]
    assert _trace_of(order) == _trace_of(order)


def test_now_advances_and_cancelled_events_are_skipped():
    loop = EventLoop()
    times = []
    handle = loop.schedule(2.0, times.append, "cancelled")
    loop.schedule(3.0, lambda: times.append(loop.now))
    loop.after(1.0, lambda: loop.after(0.5, lambda: times.append(loop.now)))
    handle.cancel()
    assert not handle.pending
    loop.run_until()
    assert times == [1.5, 3.0]
    assert loop.now == 3.0
    assert loop.pending() == 0


def test_stop_predicate_halts_before_later_events():
    loop = EventLoop()
    seen = []
    for t in range(10):
        loop.schedule(float(t), seen.append, t)
    loop.run_until(stop=lambda: len(seen) >= 4)
    assert seen == [0, 1, 2, 3]
    assert loop.pending() == 6
