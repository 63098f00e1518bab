"""Where a what-if run gets its spot market: a trace file, a shipped trace by provider + zone, or a
synthetic trace with the provider's notice and typical preemption rate.

``spotlight simulate --provider gcp --zone us-central1-b --params-b 20 --ondemand 8 --spot 16
--resolution 1280`` projects time and cost per iteration before anyone rents a GPU. With
``--zone``, the zone is looked up among the public traces shipped in the package (or under
``--traces-root`` / ``$SPOTLIGHT_TRACES``: ``spot.traces.traces_root``); without it, the provider's
synthetic market is used (``run.PROVIDER_MTBP_S``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROVIDERS = ("aws", "gcp", "azure")


@dataclass(frozen=True)
class Market:
    """What ``run.project`` replays: a trace path (with zones to keep) or a provider name."""

    source: Path | str
    zones: tuple[str, ...] | None
    description: str


def shipped_trace(provider: str, zone: str, root: Path) -> Path:
    """The first shipped trace of ``provider`` that records ``zone``; the error lists the known zones."""
    from roll_spotlight.spot.stats import discover_traces
    from roll_spotlight.spot.traces import load_trace

    known: list[str] = []
    for path in discover_traces(root):
        trace = load_trace(path)
        if trace.provider != provider:
            continue
        if zone in trace.zone_names:
            return path
        known += trace.zone_names
    raise ValueError(f"zone={zone!r}: no shipped {provider} trace under {root} records it; "
                     f"known {provider} zones: {sorted(set(known))}")


def resolve_market(provider: str | None, zone: str | None, trace: Path | None,
                   traces_root: Path | None = None) -> Market:
    """The market of a what-if from the CLI's ``--trace`` / ``--provider`` / ``--zone``."""
    if trace is not None:
        if provider is not None:
            raise ValueError("give either --trace or --provider, not both")
        return Market(trace, (zone,) if zone else None, f"trace {trace}")
    if provider is None:
        raise ValueError("a what-if needs --trace FILE or --provider {aws,gcp,azure}")
    if provider not in PROVIDERS:
        raise ValueError(f"provider={provider!r} is not one of {list(PROVIDERS)}")
    if zone is None:
        return Market(provider, None, f"synthetic {provider} market")
    from roll_spotlight.spot.traces import traces_root as find_traces_root

    path = shipped_trace(provider, zone, find_traces_root(traces_root))
    return Market(path, (zone,), f"shipped trace {path.name}, zone {zone}")
