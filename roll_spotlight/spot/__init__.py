"""Spot market core (pure Python + numpy): traces, their statistics, a synthetic generator, the
market replay (node up / notice / node down) and its event schedule, GPU prices and a cost ledger.
Nothing here imports Ray, torch or the runtime; the spot pool that applies the market to workers is
``roll_spotlight.spot_pool``.

Modules: ``traces`` (formats, ``load_trace``, ``traces_root``: the public traces shipped in ``data/``),
``stats`` (``trace_stats``, ``summarize_shipped_traces``), ``synthetic`` (``synthetic_trace``),
``market`` (``SpotMarket``, ``MarketSchedule``), ``prices`` (``PriceTable``), ``ledger`` (``CostLedger``).
"""

from roll_spotlight.spot.ledger import CostLedger, CostReport, PoolCost
from roll_spotlight.spot.market import (
    NOTICE_S_BY_PROVIDER,
    EventKind,
    MarketConfig,
    MarketEvent,
    NodeLife,
    SpotMarket,
)
from roll_spotlight.spot.prices import (
    DEFAULT_PRICE_TABLES,
    Price,
    PriceTable,
    default_prices,
    load_gcp_zone_prices,
    prices_for_trace,
)
from roll_spotlight.spot.stats import (
    TraceStats,
    ZoneStats,
    discover_traces,
    summarize_shipped_traces,
    trace_stats,
)
from roll_spotlight.spot.synthetic import DEFAULT_SYNTHETIC, SyntheticTraceConfig, synthetic_trace
from roll_spotlight.spot.traces import (
    PACKAGED_TRACES,
    CountSeries,
    EventList,
    NodeEvent,
    Trace,
    TraceFormatError,
    load_trace,
    traces_root,
)

__all__ = [
    "CostLedger", "CostReport", "PoolCost",
    "NOTICE_S_BY_PROVIDER", "EventKind", "MarketConfig", "MarketEvent", "NodeLife", "SpotMarket",
    "DEFAULT_PRICE_TABLES", "Price", "PriceTable", "default_prices", "load_gcp_zone_prices",
    "prices_for_trace",
    "TraceStats", "ZoneStats", "discover_traces", "summarize_shipped_traces", "trace_stats",
    "DEFAULT_SYNTHETIC", "SyntheticTraceConfig", "synthetic_trace",
    "PACKAGED_TRACES", "CountSeries", "EventList", "NodeEvent", "Trace", "TraceFormatError", "load_trace",
    "traces_root",
]
