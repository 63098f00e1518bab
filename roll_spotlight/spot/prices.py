"""GPU prices per pool, each with the source it comes from.

Pools are strings: ``"ondemand"``, ``"spot"``, or zone-qualified ``"ondemand/<zone>"``,
``"spot/<zone>"``. A ``PriceTable`` maps pools to ``Price`` (USD per GPU-hour); a zone-qualified
pool without its own entry falls back to its kind's default. Prices are per GPU: VM prices are
divided by the VM's GPU count, and they include the VM's vCPU/RAM share, so spot/on-demand ratios
compare like with like.

Default tables (sources as named in the shipped traces README, "Constants worth using"):

| GPU  | instance          | on-demand $/GPU-h | spot $/GPU-h | source                                     |
| ---- | ----------------- | ----------------- | ------------ | ------------------------------------------ |
| V100 | p3.2xlarge (1)    | 3.06              | 0.918        | uclasystem/bamboo simulator; andylizf/skynomad-artifact price data |
| H100 | a3-highgpu-8g / 8 | 10.3157           | 2.3724       | skynomad-gcp-h100/prices/ (us-central1, Oct 2025) |
| T4   | g4dn.12xlarge / 4 | 0.978             | 0.47615      | Hsword/SpotServe (artifact branch) plotting script comments |

For the GCP H100 trace folder, ``load_gcp_zone_prices`` gives every zone its region's prices.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from roll_spotlight.checks import require, require_number
from roll_spotlight.spot.traces import Trace, TraceFormatError

POOL_KINDS = ("ondemand", "spot")


@dataclass(frozen=True)
class Price:
    usd_per_gpu_hour: float
    source: str

    def __post_init__(self) -> None:
        require_number("Price.usd_per_gpu_hour", self.usd_per_gpu_hour, ">= 0")
        require(bool(self.source.strip()), "Price.source", self.source, "must name where the price comes from")


def split_pool(pool: str) -> tuple[str, str | None]:
    """``"spot/us-east4-a"`` -> ("spot", "us-east4-a"); ``"ondemand"`` -> ("ondemand", None)."""
    kind, sep, zone = pool.partition("/")
    if kind not in POOL_KINDS or (sep and not zone):
        raise ValueError(f"pool={pool!r}: expected 'ondemand', 'spot', 'ondemand/<zone>' or 'spot/<zone>'")
    return kind, zone or None


@dataclass(frozen=True)
class PriceTable:
    gpu_type: str
    prices: Mapping[str, Price]

    def __post_init__(self) -> None:
        for pool in self.prices:
            split_pool(pool)
        missing = [kind for kind in POOL_KINDS if kind not in self.prices]
        if missing:
            raise ValueError(f"PriceTable({self.gpu_type!r}): prices lack the default pool(s) {missing}")

    def price(self, pool: str) -> Price:
        """The pool's own price, else its kind's default."""
        kind, _ = split_pool(pool)
        return self.prices.get(pool) or self.prices[kind]

    def ondemand_for(self, pool: str) -> Price:
        """The on-demand price a pool's GPU-hours would have cost (same zone when known)."""
        _, zone = split_pool(pool)
        return self.price(f"ondemand/{zone}" if zone else "ondemand")

    def spot_ratio(self, zone: str | None = None) -> float:
        pool = f"spot/{zone}" if zone else "spot"
        return self.price(pool).usd_per_gpu_hour / self.ondemand_for(pool).usd_per_gpu_hour

    def to_dict(self) -> dict:
        return {"gpu_type": self.gpu_type,
                "prices": {pool: {"usd_per_gpu_hour": p.usd_per_gpu_hour, "source": p.source}
                           for pool, p in self.prices.items()}}


_BAMBOO_SKYNOMAD = "uclasystem/bamboo simulator; andylizf/skynomad-artifact price data"
_SKYNOMAD_PRICES = "skynomad-gcp-h100/prices/ (andylizf/skynomad-artifact, fetched 2025-10-23)"
_SPOTSERVE = "Hsword/SpotServe (artifact branch) plotting script comments"

DEFAULT_PRICE_TABLES: dict[str, PriceTable] = {
    "V100": PriceTable("V100", {
        "ondemand": Price(3.06, f"p3.2xlarge on-demand $3.06/h: {_BAMBOO_SKYNOMAD}"),
        "spot": Price(0.918, f"p3.2xlarge spot $0.918/h nominal (observed $0.918-1.846/h, Feb-Apr 2023; "
                             f"Bamboo uses $0.91/h): {_BAMBOO_SKYNOMAD}"),
    }),
    "H100": PriceTable("H100", {
        "ondemand": Price(82.52543396 / 8, f"a3-highgpu-8g us-central1 on-demand $82.5254/h / 8 GPUs: "
                                           f"{_SKYNOMAD_PRICES}"),
        "spot": Price(18.979008 / 8, f"a3-highgpu-8g us-central1 spot $18.979/h / 8 GPUs: {_SKYNOMAD_PRICES}"),
    }),
    "T4": PriceTable("T4", {
        "ondemand": Price(3.912 / 4, f"g4dn.12xlarge on-demand $3.912/h / 4 GPUs: {_SPOTSERVE}"),
        "spot": Price(1.9046 / 4, f"g4dn.12xlarge spot $1.9046/h / 4 GPUs: {_SPOTSERVE}"),
    }),
}
_GPU_BY_PROVIDER = {"aws": "V100", "gcp": "H100"}


def default_prices(gpu_type: str) -> PriceTable:
    if gpu_type not in DEFAULT_PRICE_TABLES:
        raise ValueError(f"gpu_type={gpu_type!r} has no default prices; known: {list(DEFAULT_PRICE_TABLES)}")
    return DEFAULT_PRICE_TABLES[gpu_type]


def prices_for_trace(trace: Trace) -> PriceTable:
    """Per-zone prices when the trace's folder carries them (``zones.csv``), else the GPU's defaults."""
    folder = _trace_folder(trace)
    if folder is not None and (folder / "zones.csv").is_file():
        return load_gcp_zone_prices(folder)
    gpu_type = trace.gpu_type or _GPU_BY_PROVIDER.get(trace.provider)
    if gpu_type is None:
        raise ValueError(f"trace {trace.name!r} (provider={trace.provider!r}) names no GPU type; "
                         f"pass a PriceTable (known defaults: {list(DEFAULT_PRICE_TABLES)})")
    return default_prices(gpu_type)


def _trace_folder(trace: Trace) -> Path | None:
    if trace.source_path is None:
        return None
    return trace.source_path if trace.source_path.is_dir() else trace.source_path.parent


def load_gcp_zone_prices(folder: Path | str) -> PriceTable:
    """H100 prices per zone from ``zones.csv`` (zone -> region), preferring ``prices/<region>_*.json``.

    Both give a3-highgpu-8g VM prices; per GPU = VM price / the VM's GPU count (8).
    """
    folder = Path(folder)
    prices: dict[str, Price] = dict(DEFAULT_PRICE_TABLES["H100"].prices)
    for zone, region, row in _zone_rows(folder / "zones.csv"):
        spot, ondemand = _region_prices(folder, region) or _zones_csv_prices(folder, zone, row)
        prices[f"spot/{zone}"], prices[f"ondemand/{zone}"] = spot, ondemand
    return PriceTable("H100", prices)


def _zone_rows(path: Path):
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        needed = ("zone", "region", "a3_highgpu_8g_spot_usd_per_hour", "a3_highgpu_8g_on_demand_usd_per_hour")
        missing = [c for c in needed if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceFormatError(path, 1, ",".join(reader.fieldnames or []), f"missing column(s) {missing}")
        for row in reader:
            yield row["zone"].strip(), row["region"].strip(), row


def _region_prices(folder: Path, region: str) -> tuple[Price, Price] | None:
    files = sorted((folder / "prices").glob(f"{region}_a3-highgpu-8g.json"))
    if not files:
        return None
    info = json.loads(files[0].read_text("utf-8"))
    gpus = sum(c["quantity"] for c in info.get("components", []) if c.get("label") == "gpu") or 8
    where = f"{folder.name}/prices/{files[0].name} (andylizf/skynomad-artifact, fetched {info['fetched_at'][:10]})"
    vm = f"{info['machine_type']} {region}"
    spot, ondemand = info["price"], info["on_demand_price"]
    return (Price(spot / gpus, f"{vm} spot ${spot:.4f}/h / {gpus:g} GPUs: {where}"),
            Price(ondemand / gpus, f"{vm} on-demand ${ondemand:.4f}/h / {gpus:g} GPUs: {where}"))


def _zones_csv_prices(folder: Path, zone: str, row: dict) -> tuple[Price, Price]:
    where = f"{folder.name}/zones.csv (andylizf/skynomad-artifact)"
    try:
        spot = float(row["a3_highgpu_8g_spot_usd_per_hour"])
        ondemand = float(row["a3_highgpu_8g_on_demand_usd_per_hour"])
    except ValueError as err:
        raise ValueError(f"{folder / 'zones.csv'}: zone {zone!r}: bad price: {err}") from err
    return (Price(spot / 8, f"a3-highgpu-8g {zone} spot ${spot}/h / 8 GPUs: {where}"),
            Price(ondemand / 8, f"a3-highgpu-8g {zone} on-demand ${ondemand}/h / 8 GPUs: {where}"))
