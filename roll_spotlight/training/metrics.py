"""Metrics sinks of a run directory: JSONL always, TensorBoard event files when available."""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

log = logging.getLogger(__name__)


class MetricsWriter:
    """Appends one JSON object per record to `metrics.jsonl`; mirrors scalars to TensorBoard."""

    def __init__(self, run_dir: Path, track_with: str = "jsonl"):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb = self._tensorboard(run_dir) if track_with == "tensorboard" else None

    @staticmethod
    def _tensorboard(run_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log.warning("track_with=tensorboard but tensorboard is not installed; writing JSONL only")
            return None
        return SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def write(self, step: int, record: dict) -> None:
        row = {"step": step} | {k: _plain(v) for k, v in record.items()}
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for key, value in row.items():
                if isinstance(value, (int, float)) and key != "step" and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)

    def truncate_after(self, step: int) -> None:
        """Drop records after `step` (a resumed run rewrites them, so the file matches a clean run)."""
        if self.path.is_file():
            rows = [r for r in self.path.read_text().splitlines() if r.strip() and json.loads(r)["step"] <= step]
            self.path.write_text("".join(r + "\n" for r in rows))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def _plain(value):
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    return value


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
