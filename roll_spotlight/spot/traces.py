"""Spot-capacity traces: data types and loaders for the public trace formats.

A trace says, per zone, how many spot nodes a cluster had (or could have had) over time. Three
on-disk formats exist in the public traces shipped with the package (``traces_root``; their README is
``roll_spotlight/spot/data/README.md``):

1. **event CSV** (``bamboo-spot-traces/aws/p3-trace.csv``): no header, rows ``time_ms,event,node``
   with ``event`` in {add, remove}, CRLF line endings, sorted by time. Named nodes, one zone.
2. **count JSON** (``skypilot-aws-v100-multinode/*/*.json``):
   ``{"metadata": {"gap_seconds": 300}, "data": [n0, n1, ...]}``, one zone per file (the zone is
   the file name up to the first ``_``). A folder of such files loads as one multi-zone trace;
   zones are aligned by sample index only (the files carry no absolute time).
3. **probe CSV** (``skynomad-gcp-h100/h100_probe_counts_{wide,long}.csv``): header row; wide has
   ``scheduled_at_utc,tick,<zone columns>``, long has ``scheduled_at_utc,tick,zone,...,
   instances_created``. Ticks are 600 s apart; missing ticks (746-755 in the shipped file) keep
   the previous value and are recorded in ``CountSeries.gaps``.

``load_trace`` sniffs the format from the content, never from the suffix alone.

Two kinds of measurement are mixed in these traces (``Trace.measures``): ``"running"`` traces follow
live instances, so a drop is a real reclamation; ``"capacity"`` traces record how many instances a
zone would grant, so using a drop as a preemption is an approximation (preempt whatever runs above
the new capacity).

Time convention: every zone is a step function on ``[start_s, end_s]`` in trace seconds. For count
traces ``end_s`` is the time of the last sample (samples are treated as instants, the convention of
the README's summary table); for event traces it is the time of the last event.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, NoReturn, Union

import numpy as np

logger = logging.getLogger(__name__)

PROVIDERS = ("aws", "gcp", "azure")
KINDS = ("events", "counts")
MEASURES = ("running", "capacity")
EVENT_OPS = ("add", "remove")

PACKAGED_TRACES = Path(__file__).resolve().parent / "data"
TRACES_ENV = "SPOTLIGHT_TRACES"

_PROBE_REQUIRED = ("scheduled_at_utc", "tick")
_PROBE_LONG_REQUIRED = ("scheduled_at_utc", "tick", "zone", "instances_created")


class TraceFormatError(ValueError):
    """A trace file that does not follow its format; names the file, the 1-based line and the text."""

    def __init__(self, path: Path | str, line: int, text: str, reason: str) -> None:
        self.path = str(path)
        self.line = line
        self.text = text
        self.reason = reason
        super().__init__(f"{path}:{line}: {reason}: {text!r}")


@dataclass(frozen=True)
class NodeEvent:
    """One row of an event trace: node ``node`` joins (``add``) or is reclaimed (``remove``)."""

    time_s: float
    op: str
    node: str


@dataclass(frozen=True, eq=False)
class CountSeries:
    """Step function N(t): ``counts[i]`` holds on ``[times_s[i], times_s[i+1])``; defined up to ``end_s``.

    ``gaps`` lists ``(t0, t1)`` windows with no sample; the value before the gap is held through it.
    """

    times_s: np.ndarray
    counts: np.ndarray
    end_s: float
    gaps: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        assert self.times_s.ndim == 1 and self.times_s.shape == self.counts.shape, "shape mismatch"
        assert self.times_s.size > 0, "empty count series"
        assert np.all(np.diff(self.times_s) > 0), "times must increase strictly"
        assert self.end_s >= self.times_s[-1], "end_s before the last sample"

    @property
    def start_s(self) -> float:
        return float(self.times_s[0])

    @property
    def span_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def capacity(self) -> int:
        return int(self.counts.max())

    def value_at(self, t: float) -> int:
        """N(t); before the first sample the series is 0."""
        i = int(np.searchsorted(self.times_s, t, side="right")) - 1
        return 0 if i < 0 else int(self.counts[i])

    def time_mean(self) -> float:
        """Time-weighted mean of N over ``[start_s, end_s]`` (the plain mean if the span is 0)."""
        if self.span_s == 0:
            return float(self.counts.mean())
        widths = np.diff(np.append(self.times_s, self.end_s))
        return float(np.dot(widths, self.counts) / self.span_s)


@dataclass(frozen=True)
class EventList:
    """Named joins and preemptions in one zone, sorted by time; each node added once, removed at most once."""

    events: tuple[NodeEvent, ...]
    start_s: float
    end_s: float

    @property
    def span_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def capacity(self) -> int:
        return self.alive_series().capacity

    def alive_series(self) -> CountSeries:
        """The alive count as a step function; simultaneous rows collapse into one step."""
        times: list[float] = [self.start_s]
        counts: list[int] = [0]
        for ev in self.events:
            alive = counts[-1] + (1 if ev.op == "add" else -1)
            if ev.time_s == times[-1]:
                counts[-1] = alive
            else:
                times.append(ev.time_s)
                counts.append(alive)
        return CountSeries(np.asarray(times, float), np.asarray(counts, np.int64), self.end_s)


ZoneTrace = Union[EventList, CountSeries]


@dataclass(frozen=True, eq=False)
class Trace:
    """A loaded trace: per-zone event lists (``kind="events"``) or count step functions (``"counts"``)."""

    name: str
    kind: str
    measures: str
    provider: str
    zones: Mapping[str, ZoneTrace]
    gpu_type: str | None = None
    source_path: Path | None = None
    start_utc: str | None = None
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        _check_choice("kind", self.kind, KINDS)
        _check_choice("measures", self.measures, MEASURES)
        _check_choice("provider", self.provider, PROVIDERS)
        if not self.zones:
            raise ValueError(f"trace {self.name!r}: zones is empty")
        expected = EventList if self.kind == "events" else CountSeries
        for zone, data in self.zones.items():
            if not isinstance(data, expected):
                raise ValueError(f"trace {self.name!r}: zone {zone!r} holds {type(data).__name__}, "
                                 f"kind={self.kind!r} needs {expected.__name__}")

    @property
    def zone_names(self) -> tuple[str, ...]:
        return tuple(self.zones)

    @property
    def span_s(self) -> float:
        """The longest zone span (zones of one trace need not cover the same time)."""
        return max(z.span_s for z in self.zones.values())

    @property
    def end_s(self) -> float:
        return max(z.end_s for z in self.zones.values())

    @property
    def capacity(self) -> dict[str, int]:
        """Per zone, the largest alive/available count seen."""
        return {name: z.capacity for name, z in self.zones.items()}

    def alive_series(self, zone: str) -> CountSeries:
        data = self._zone(zone)
        return data.alive_series() if isinstance(data, EventList) else data

    def select_zones(self, zones: tuple[str, ...]) -> "Trace":
        return replace(self, zones={z: self._zone(z) for z in zones})

    def _zone(self, zone: str) -> ZoneTrace:
        if zone not in self.zones:
            raise ValueError(f"trace {self.name!r}: zone={zone!r} unknown; known: {list(self.zones)}")
        return self.zones[zone]


def _check_choice(key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not one of {list(allowed)}")


def traces_root(override: Path | str | None = None) -> Path:
    """The folder of public spot traces to use: ``override`` (a ``--traces-root``), else
    ``$SPOTLIGHT_TRACES``, else the copy shipped inside the package (``PACKAGED_TRACES``), so that
    a clone or an installed wheel needs nothing beside it. A named folder that does not exist is a
    ValueError naming the option or variable."""
    for value, name in ((override, "--traces-root"), (os.environ.get(TRACES_ENV), f"${TRACES_ENV}")):
        if value:
            if not Path(value).is_dir():
                raise ValueError(f"{name}={value}: no such folder")
            return Path(value)
    return PACKAGED_TRACES


# ---------------------------------------------------------------------------------------------
# load_trace: sniff, parse, fill in metadata


def load_trace(path: Path | str, *, provider: str | None = None, zone: str | None = None,
               measures: str | None = None) -> Trace:
    """Load a trace file (or a folder of count-JSON zone files) in any supported format.

    provider: "aws" | "gcp" | "azure"; default inferred from the path, else from the format
        (event CSV and count JSON come from AWS collections, probe CSV from GCP).
    zone: for a multi-zone trace, keep only this zone; for a single-zone file, the zone's name
        (default: the file name, e.g. ``p3`` for ``p3-trace.csv``, ``us-east-2b`` for
        ``us-east-2b_v100_1.json``).
    measures: "running" | "capacity"; default by format and path (event CSV and a path with
        ``preemption`` -> running; probes, ``availability`` or anything else -> capacity).
    Raises TraceFormatError (a ValueError) for malformed content, ValueError for bad arguments.
    """
    path = Path(path)
    if provider is not None:
        _check_choice("provider", provider, PROVIDERS)
    if measures is not None:
        _check_choice("measures", measures, MEASURES)
    files = _trace_files(path) if path.is_dir() else [path]
    fmt, zones, start_utc, notes = _parse_files(files)
    trace = Trace(
        name=_trace_name(path),
        kind="events" if fmt == "events" else "counts",
        measures=measures or _infer_measures(path, fmt),
        provider=provider or _infer_provider(path, fmt),
        zones=zones,
        gpu_type=_infer_gpu_type(path),
        source_path=path,
        start_utc=start_utc,
        notes=notes,
    )
    return _apply_zone_arg(trace, zone)


def sniff_format(path: Path) -> str | None:
    """"events" | "count_json" | "probe" for a trace file, None for anything else (cheap look)."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        head = fh.read(4096)
    first = head.lstrip()[:1]
    if first == "{":
        return _sniff_json(path)
    line = head.split("\n", 1)[0].strip()
    if re.fullmatch(r"\d+,(add|remove),\S+", line):
        return "events"
    if line.split(",")[0] == _PROBE_REQUIRED[0]:
        return "probe"
    return None


def _sniff_json(path: Path) -> str | None:
    """JSON that parses to something other than a count trace (a price file) is not a trace; JSON
    that does not parse is treated as a broken count trace so that loading it reports the line."""
    try:
        obj = json.loads(Path(path).read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "count_json"
    return "count_json" if isinstance(obj, dict) and "data" in obj else None


def _is_count_json(obj: object) -> bool:
    return isinstance(obj, dict) and "data" in obj and isinstance(obj.get("metadata"), dict)


def _trace_files(folder: Path) -> list[Path]:
    """The trace files directly inside ``folder``: one file, or several count-JSON zone files."""
    found = {p: sniff_format(p) for p in sorted(folder.iterdir())
             if p.is_file() and p.suffix in (".csv", ".json")}
    found = {p: f for p, f in found.items() if f is not None and not is_redundant_long_probe(p)}
    if len(found) == 1 or (found and set(found.values()) == {"count_json"}):
        return list(found)
    raise ValueError(f"{folder}: expected one trace file or several count-JSON files, "
                     f"found {[f'{p.name} ({f})' for p, f in found.items()] or 'none'}")


def is_redundant_long_probe(path: Path) -> bool:
    """A ``*_long.csv`` probe file is redundant when its ``*_wide.csv`` twin sits beside it."""
    stem = path.stem
    return stem.endswith("_long") and path.with_name(stem[:-5] + "_wide.csv").exists()


def _parse_files(files: list[Path]) -> tuple[str, dict[str, ZoneTrace], str | None, tuple[str, ...]]:
    fmt = sniff_format(files[0]) or _raise_unrecognised(files[0])
    if fmt == "events":
        return fmt, {_zone_from_name(files[0]): parse_event_csv(files[0])}, None, ()
    if fmt == "probe":
        zones, start_utc = parse_probe_csv(files[0])
        gaps = next(iter(zones.values())).gaps
        notes = tuple(f"no probe in [{a:.0f}, {b:.0f}) s: previous value held" for a, b in gaps)
        return fmt, zones, start_utc, notes
    zones: dict[str, ZoneTrace] = {}
    for path in files:
        name = _zone_from_name(path)
        if name in zones:
            raise ValueError(f"{path}: zone {name!r} appears in two files")
        zones[name] = parse_count_json(path)
    return fmt, zones, None, ()


def _raise_unrecognised(path: Path) -> NoReturn:
    first = Path(path).read_text("utf-8", errors="replace").split("\n", 1)[0].rstrip("\r")
    raise TraceFormatError(path, 1, first, "not a known trace format (event CSV, count JSON, probe CSV)")


def _apply_zone_arg(trace: Trace, zone: str | None) -> Trace:
    if zone is None:
        return trace
    if zone in trace.zones:
        return trace.select_zones((zone,))
    if len(trace.zones) == 1:
        return replace(trace, zones={zone: next(iter(trace.zones.values()))})
    raise ValueError(f"zone={zone!r} is not in trace {trace.name!r}; known: {list(trace.zones)}")


def _trace_name(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}" if path.parent.name else path.stem


def _zone_from_name(path: Path) -> str:
    stem = path.stem.split("_", 1)[0]
    return stem[: -len("-trace")] if stem.endswith("-trace") else stem


def _path_tokens(path: Path) -> set[str]:
    """Words of the last three path components (``bamboo-spot-traces/aws/p3-trace.csv``), so that
    unrelated parent folders (a home directory) cannot decide the provider."""
    tail = "/".join((path.resolve() if path.exists() else path).parts[-3:]).lower()
    return set(re.split(r"[^a-z0-9]+", tail))


def _infer_provider(path: Path, fmt: str) -> str:
    tokens = _path_tokens(path)
    for provider in PROVIDERS:
        if provider in tokens:
            return provider
    fallback = "gcp" if fmt == "probe" else "aws"
    logger.info("%s: provider not in the path; assuming %r from the %s format", path, fallback, fmt)
    return fallback


def _infer_measures(path: Path, fmt: str) -> str:
    tokens = _path_tokens(path)
    if fmt == "events" or ("preemption" in tokens and "availability" not in tokens):
        return "running"
    return "capacity"


_GPU_TOKENS = {"v100": "V100", "p3": "V100", "h100": "H100", "a3": "H100", "t4": "T4", "g4dn": "T4"}


def _infer_gpu_type(path: Path) -> str | None:
    tokens = _path_tokens(path)
    return next((gpu for token, gpu in _GPU_TOKENS.items() if token in tokens), None)


# ---------------------------------------------------------------------------------------------
# Format 1: event CSV


def _read_lines(path: Path) -> list[str]:
    try:
        text = Path(path).read_text("utf-8")
    except UnicodeDecodeError as err:
        raise TraceFormatError(path, 1, repr(err.object[err.start:err.end]), "not UTF-8 text") from err
    return [line.rstrip("\r") for line in text.split("\n")]


def parse_event_csv(path: Path) -> EventList:
    """Rows ``time_ms,add|remove,node``; blank lines are skipped; see the module docstring."""
    events: list[NodeEvent] = []
    state: dict[str, str] = {}  # node -> last op
    for lineno, line in enumerate(_read_lines(path), 1):
        if not line.strip():
            continue
        ev = _parse_event_row(path, lineno, line)
        _check_event(path, lineno, line, ev, events[-1].time_s if events else 0.0, state)
        state[ev.node] = ev.op
        events.append(ev)
    if not events:
        raise TraceFormatError(path, 1, "", "no events")
    return EventList(tuple(events), 0.0, events[-1].time_s)


def _parse_event_row(path: Path, lineno: int, line: str) -> NodeEvent:
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != 3:
        raise TraceFormatError(path, lineno, line, f"expected 3 fields time_ms,event,node, got {len(fields)}")
    time_ms, op, node = fields
    if not time_ms.isdigit():
        raise TraceFormatError(path, lineno, line, "time_ms must be a non-negative integer")
    if op not in EVENT_OPS:
        raise TraceFormatError(path, lineno, line, f"event must be one of {list(EVENT_OPS)}")
    if not node:
        raise TraceFormatError(path, lineno, line, "empty node name")
    return NodeEvent(int(time_ms) / 1000.0, op, node)


def _check_event(path: Path, lineno: int, line: str, ev: NodeEvent, prev_t: float,
                 state: dict[str, str]) -> None:
    if ev.time_s < prev_t:
        raise TraceFormatError(path, lineno, line, "rows are not sorted by time")
    seen = state.get(ev.node)
    if ev.op == "add" and seen is not None:
        raise TraceFormatError(path, lineno, line, f"node {ev.node!r} added twice")
    if ev.op == "remove" and seen != "add":
        what = "removed twice" if seen == "remove" else "removed before it was added"
        raise TraceFormatError(path, lineno, line, f"node {ev.node!r} {what}")


# ---------------------------------------------------------------------------------------------
# Format 2: count JSON


def parse_count_json(path: Path) -> CountSeries:
    """``{"metadata": {"gap_seconds": g}, "data": [n0, ...]}`` -> N(t) sampled every g seconds."""
    text = "\n".join(_read_lines(path))
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise TraceFormatError(path, err.lineno, _line_of(text, err.lineno), f"bad JSON: {err.msg}") from err
    if not _is_count_json(obj):
        raise TraceFormatError(path, 1, _line_of(text, 1), 'expected {"metadata": {...}, "data": [...]}')
    gap = obj["metadata"].get("gap_seconds")
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not gap > 0:
        line = _line_at(text, text.find('"gap_seconds"'))
        raise TraceFormatError(path, line, f"gap_seconds = {gap!r}", "gap_seconds must be a positive number")
    counts = _count_array(path, text, obj["data"])
    times = np.arange(counts.size, dtype=float) * float(gap)
    return CountSeries(times, counts, float(times[-1]))


def _count_array(path: Path, text: str, data: object) -> np.ndarray:
    line = _line_at(text, text.find('"data"'))
    if not isinstance(data, list) or not data:
        raise TraceFormatError(path, line, f"data = {str(data)[:40]}", "data must be a non-empty list")
    for i, value in enumerate(data):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TraceFormatError(path, line, f"data[{i}] = {value!r}", "counts must be non-negative integers")
    return np.asarray(data, dtype=np.int64)


def _line_at(text: str, offset: int) -> int:
    return text.count("\n", 0, max(offset, 0)) + 1


def _line_of(text: str, lineno: int) -> str:
    lines = text.split("\n")
    return lines[lineno - 1] if 0 < lineno <= len(lines) else ""


# ---------------------------------------------------------------------------------------------
# Format 3: probe CSV (wide or long)


def parse_probe_csv(path: Path) -> tuple[dict[str, CountSeries], str]:
    """Wide or long probe counts -> per-zone N(t) on the shared ticks, plus the UTC time of t = 0.

    Times come from ``tick`` times the tick length, which is read off ``scheduled_at_utc`` and
    checked on every row. A tick missing for all zones is a gap: the previous value is held.
    """
    lines = _read_lines(path)
    header = next(csv.reader([lines[0]]))
    missing = [c for c in _PROBE_REQUIRED if c not in header]
    if missing:
        raise TraceFormatError(path, 1, lines[0], f"missing column(s) {missing}")
    rows = _probe_rows(path, lines, header)
    table = _probe_table_long(path, rows, header) if "zone" in header else _probe_table_wide(path, rows, header)
    return _probe_series(path, rows, table)


_ProbeRow = tuple[int, str, dict[str, str]]  # (line number, raw line, column -> value)


def _probe_rows(path: Path, lines: list[str], header: list[str]) -> list[_ProbeRow]:
    rows: list[_ProbeRow] = []
    for lineno, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        values = next(csv.reader([line]))
        if len(values) != len(header):
            raise TraceFormatError(path, lineno, line, f"expected {len(header)} columns, got {len(values)}")
        rows.append((lineno, line, dict(zip(header, values))))
    if not rows:
        raise TraceFormatError(path, 1, lines[0], "no data rows")
    return rows


def _probe_int(path: Path, row: _ProbeRow, column: str) -> int:
    lineno, line, values = row
    text = values[column].strip()
    if not text.isdigit():
        raise TraceFormatError(path, lineno, line, f"{column} must be a non-negative integer, got {text!r}")
    return int(text)


def _probe_table_wide(path: Path, rows: list[_ProbeRow], header: list[str]) -> dict[str, dict[int, int]]:
    zones = [c for c in header if c not in _PROBE_REQUIRED]
    if not zones:
        raise TraceFormatError(path, 1, ",".join(header), "no zone columns")
    table: dict[str, dict[int, int]] = {z: {} for z in zones}
    for row in rows:
        tick = _probe_int(path, row, "tick")
        if tick in table[zones[0]]:
            raise TraceFormatError(path, row[0], row[1], f"tick {tick} repeated")
        for zone in zones:
            table[zone][tick] = _probe_int(path, row, zone)
    return table


def _probe_table_long(path: Path, rows: list[_ProbeRow], header: list[str]) -> dict[str, dict[int, int]]:
    missing = [c for c in _PROBE_LONG_REQUIRED if c not in header]
    if missing:
        raise TraceFormatError(path, 1, ",".join(header), f"missing column(s) {missing}")
    table: dict[str, dict[int, int]] = {}
    for row in rows:
        zone, tick = row[2]["zone"].strip(), _probe_int(path, row, "tick")
        per_zone = table.setdefault(zone, {})
        if tick in per_zone:
            raise TraceFormatError(path, row[0], row[1], f"tick {tick} repeated for zone {zone!r}")
        per_zone[tick] = _probe_int(path, row, "instances_created")
    return dict(sorted(table.items()))


def _probe_series(path: Path, rows: list[_ProbeRow],
                  table: dict[str, dict[int, int]]) -> tuple[dict[str, CountSeries], str]:
    tick_times = _probe_tick_times(path, rows)
    ticks = np.array(sorted(tick_times), dtype=np.int64)
    tick_s = _tick_length(tick_times)
    times = (ticks - ticks[0]) * tick_s
    gaps = tuple((float(times[i] + tick_s), float(times[i + 1]))
                 for i in np.flatnonzero(np.diff(ticks) > 1))
    zones = {zone: CountSeries(times, _held_counts(path, zone, ticks, values), float(times[-1]), gaps)
             for zone, values in table.items()}
    origin = tick_times[int(ticks[0])].strftime("%Y-%m-%dT%H:%M:%SZ")
    return zones, origin


def _probe_tick_times(path: Path, rows: list[_ProbeRow]) -> dict[int, datetime]:
    """tick -> scheduled time; every row of one tick must name the same time."""
    out: dict[int, datetime] = {}
    for row in rows:
        tick, when = _probe_int(path, row, "tick"), _parse_utc(path, row)
        if out.setdefault(tick, when) != when:
            raise TraceFormatError(path, row[0], row[1], f"tick {tick} has two scheduled times")
    first = min(out)
    tick_s = _tick_length(out)
    for row in rows:
        tick = _probe_int(path, row, "tick")
        if abs((out[tick] - out[first]).total_seconds() - (tick - first) * tick_s) > 1.0:
            raise TraceFormatError(path, row[0], row[1], f"scheduled time is off the {tick_s:.0f} s tick grid")
    return out


def _tick_length(tick_times: dict[int, datetime]) -> float:
    ticks = sorted(tick_times)
    if len(ticks) < 2:
        return 600.0
    a, b = ticks[0], ticks[1]
    return (tick_times[b] - tick_times[a]).total_seconds() / (b - a)


def _parse_utc(path: Path, row: _ProbeRow) -> datetime:
    text = row[2]["scheduled_at_utc"].strip()
    try:
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError as err:
        raise TraceFormatError(path, row[0], row[1], f"bad scheduled_at_utc {text!r}") from err
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _held_counts(path: Path, zone: str, ticks: np.ndarray, values: dict[int, int]) -> np.ndarray:
    """Counts on the shared ticks; a tick this zone lacks holds its previous value."""
    if int(ticks[0]) not in values:
        raise TraceFormatError(path, 1, zone, f"zone {zone!r} has no value at the first tick {ticks[0]}")
    out = np.empty(ticks.size, dtype=np.int64)
    for i, tick in enumerate(ticks.tolist()):
        out[i] = values.get(tick, out[i - 1] if i else 0)
    return out
