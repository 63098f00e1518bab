"""GPU-hour cost ledger: GPU-seconds per pool, priced by a ``PriceTable``.

Usage: ``start(node, pool, t)`` when a node begins to bill, ``stop(node, t)`` when it stops (a
preempted spot node stops at its NODE_DOWN), or ``add(pool, gpu_seconds)`` for usage measured
elsewhere. ``report()`` prices every pool and compares with running the same GPU-hours on demand
(in the same zone when the table has a per-zone on-demand price), which is the "savings" figure.

Times are seconds on any one clock; the ledger only takes differences. Intervals of a node are
stop - start (>= 0); a node is billed in at most one open interval at a time.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from roll_spotlight.spot.prices import PriceTable, split_pool


@dataclass(frozen=True)
class PoolCost:
    pool: str
    gpu_hours: float
    usd: float
    usd_per_gpu_hour: float
    ondemand_usd: float  # the same GPU-hours at the on-demand price
    source: str


@dataclass(frozen=True)
class CostReport:
    gpu_type: str
    pools: tuple[PoolCost, ...]
    total_gpu_hours: float
    total_usd: float
    ondemand_usd: float  # everything on demand
    savings_usd: float
    savings_fraction: float  # savings / ondemand_usd (0 when nothing was used)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Open:
    pool: str
    start_s: float
    gpus: int


class CostLedger:
    def __init__(self, prices: PriceTable) -> None:
        self.prices = prices
        self._gpu_seconds: dict[str, float] = {}
        self._open: dict[str, _Open] = {}

    @property
    def open_nodes(self) -> tuple[str, ...]:
        return tuple(self._open)

    def start(self, node: str, pool: str, t: float, gpus: int = 1) -> None:
        split_pool(pool)
        if node in self._open:
            raise ValueError(f"node={node!r} is already billing in pool {self._open[node].pool!r}")
        if gpus < 1:
            raise ValueError(f"gpus={gpus!r} must be >= 1")
        self._open[node] = _Open(pool, float(t), gpus)

    def stop(self, node: str, t: float) -> float:
        """Close the node's interval; returns the GPU-seconds it added."""
        if node not in self._open:
            raise ValueError(f"node={node!r} is not billing (known: {list(self._open)})")
        entry = self._open[node]
        if t < entry.start_s:
            raise ValueError(f"node={node!r}: stop t={t!r} precedes its start {entry.start_s!r}")
        del self._open[node]
        gpu_seconds = (t - entry.start_s) * entry.gpus
        self.add(entry.pool, gpu_seconds)
        return gpu_seconds

    def add(self, pool: str, gpu_seconds: float) -> None:
        split_pool(pool)
        if not (gpu_seconds >= 0 and math.isfinite(gpu_seconds)):
            raise ValueError(f"gpu_seconds={gpu_seconds!r} must be finite and >= 0")
        self._gpu_seconds[pool] = self._gpu_seconds.get(pool, 0.0) + gpu_seconds

    def gpu_seconds(self, now: float | None = None) -> dict[str, float]:
        """GPU-seconds per pool; open intervals count up to ``now`` (required when any is open)."""
        totals = dict(self._gpu_seconds)
        if self._open and now is None:
            raise ValueError(f"nodes {list(self._open)} are still billing; pass now= or stop them")
        for node, entry in self._open.items():
            if now < entry.start_s:
                raise ValueError(f"now={now!r} precedes the start {entry.start_s!r} of node {node!r}")
            totals[entry.pool] = totals.get(entry.pool, 0.0) + (now - entry.start_s) * entry.gpus
        return totals

    def report(self, now: float | None = None) -> CostReport:
        pools = tuple(self._pool_cost(pool, s) for pool, s in sorted(self.gpu_seconds(now).items()))
        total_usd = sum(p.usd for p in pools)
        ondemand_usd = sum(p.ondemand_usd for p in pools)
        savings = ondemand_usd - total_usd
        return CostReport(
            gpu_type=self.prices.gpu_type, pools=pools,
            total_gpu_hours=sum(p.gpu_hours for p in pools), total_usd=total_usd,
            ondemand_usd=ondemand_usd, savings_usd=savings,
            savings_fraction=savings / ondemand_usd if ondemand_usd > 0 else 0.0,
        )

    def _pool_cost(self, pool: str, gpu_seconds: float) -> PoolCost:
        price = self.prices.price(pool)
        hours = gpu_seconds / 3600.0
        ondemand = self.prices.ondemand_for(pool).usd_per_gpu_hour * hours
        return PoolCost(pool, hours, price.usd_per_gpu_hour * hours, price.usd_per_gpu_hour, ondemand, price.source)
