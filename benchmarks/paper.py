"""The paper's reported numbers, for the column beside ours.

Only the abstract of Spotlight (arXiv 2606.19004) is public (``shared/paper/spotlight-seed.md``),
so these are the abstract's figures, restated as numbers with their source; no per-resolution
breakdown, cluster shape or trace is published. Each claim names the row of our report it sits next to.
"""
from __future__ import annotations

from dataclasses import dataclass

SOURCE = "Spotlight, arXiv 2606.19004, abstract"


@dataclass(frozen=True)
class PaperClaim:
    key: str
    low: float | None
    high: float | None
    unit: str
    what: str
    source: str = SOURCE

    def text(self) -> str:
        if self.low is None:
            return self.what
        span = f"{self.low:g}" if self.high in (None, self.low) else f"{self.low:g}-{self.high:g}"
        return f"{span}{self.unit}"


PAPER_CLAIMS: dict[str, PaperClaim] = {
    "time_to_target": PaperClaim("time_to_target", 4.0, 4.0, "x",
                                 "same target validation score reached 4x faster than baselines"),
    "cost_to_target": PaperClaim("cost_to_target", 1.4, 6.4, "x",
                                 "total cost lower by 1.4x to 6.4x (range over settings; not split by resolution)"),
    "spot_discount": PaperClaim("spot_discount", 69.0, 77.0, "%", "spot GPUs cost 69-77% less than on-demand"),
    "sp_recovery": PaperClaim("sp_recovery", None, None, "",
                              "SP group recovery from minutes (restart) to sub-second (on-node state reuse)"),
    "resolutions": PaperClaim("resolutions", 512.0, 1280.0, " px", "Qwen-Image at 512x512 and 1280x1280"),
}


def paper_text(key: str) -> str:
    claim = PAPER_CLAIMS[key]
    return f"{claim.text()} ({claim.source})"
