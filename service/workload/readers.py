"""Readers for public workload traces: Azure LLM 2023, Mooncake FAST'25, ServeGen client stats.

Request-trace readers return a ``ReadResult``. A malformed row (missing column, non-number,
length < 1, arrival earlier than the previous row's) raises ``InvalidInputError`` naming the
file and the 1-based line number, unless ``skip_bad=True``: then it is skipped, counted and the
first few are reported. A row that is not UTF-8 is one malformed row (the file is decoded line
by line). Both formats are documented as sorted by time, so a backwards timestamp marks a corrupt
row rather than an unsorted file. A bad header or an unreadable file always raises.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from datetime import date
from functools import lru_cache
from pathlib import Path

from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec, Workload
from service.workload.client import ClientStats, GapLaw, LengthWindow, Pmf, RateWindow

#: How many bad lines a ``ReadResult`` keeps (all of them are counted).
MAX_REPORTED_BAD_LINES = 10
#: Mooncake prefix-block size: one hash id per block of this many prompt tokens.
MOONCAKE_BLOCK_TOKENS = 512

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_SERVEGEN_LAWS: dict[str, GapLaw] = {"Gamma": "gamma", "Weibull": "weibull"}
_SERVEGEN_LENGTH_WINDOW_S = 21600.0
_CHUNK_RE = re.compile(r"^chunk-(\d+)-trace\.csv$")


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Requests read from one file, sorted by arrival, and what was skipped.

    ``bad_lines`` holds ``(line_number, reason)`` for the first ``MAX_REPORTED_BAD_LINES`` skipped
    lines (1-based); ``num_bad`` counts all of them.
    """

    path: str
    requests: list[RequestSpec]
    num_bad: int = 0
    bad_lines: list[tuple[int, str]] = field(default_factory=list)

    def workload(self, name: str | None = None) -> Workload:
        """The requests as a ``Workload`` named ``name`` (default: the file's stem)."""
        return Workload(name or Path(self.path).stem, self.requests)


class _BadRow(Exception):
    """One malformed row; the reader turns it into an error or a skipped line."""


class _BadLineSink:
    """Counts bad rows or raises on the first one, depending on ``skip_bad``."""

    def __init__(self, path: Path, skip_bad: bool) -> None:
        self.path = path
        self.skip_bad = skip_bad
        self.num_bad = 0
        self.bad_lines: list[tuple[int, str]] = []

    def report(self, line_no: int, reason: str) -> None:
        if not self.skip_bad:
            raise InvalidInputError(f"{self.path}:{line_no}: {reason}", culprit=f"{self.path}:{line_no}")
        self.num_bad += 1
        if len(self.bad_lines) < MAX_REPORTED_BAD_LINES:
            self.bad_lines.append((line_no, reason))


def _positive_int(text: str, column: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _BadRow(f"{column} is not an integer: {text!r}") from None
    if value < 1:
        raise _BadRow(f"{column} must be >= 1, got {value}")
    return value


@lru_cache(maxsize=64)
def _day_ordinal(text: str) -> int:
    return date.fromisoformat(text).toordinal()


def _azure_time(text: str) -> tuple[int, float]:
    """``YYYY-MM-DD HH:MM:SS.fffffff`` as (day ordinal, seconds of day); any number of fraction digits."""
    # hand-parsed: strptime takes at most 6 fraction digits and is ~10x slower
    date_text, sep, time_text = text.strip().partition(" ")
    parts = time_text.split(":")
    if not sep or len(parts) != 3:
        raise _BadRow(f"TIMESTAMP is not 'YYYY-MM-DD HH:MM:SS.f': {text!r}")
    try:
        day = _day_ordinal(date_text)
        hours, minutes, seconds = int(parts[0]), int(parts[1]), float(parts[2])
    except ValueError:
        raise _BadRow(f"TIMESTAMP is not 'YYYY-MM-DD HH:MM:SS.f': {text!r}") from None
    if not (0 <= hours < 24 and 0 <= minutes < 60 and 0.0 <= seconds < 61.0):
        raise _BadRow(f"TIMESTAMP out of range: {text!r}")
    return day, hours * 3600 + minutes * 60 + seconds


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 0:
        raise InvalidInputError(f"limit must be >= 0 or None, got {limit}")


def _open_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInputError(f"{path}: cannot read: {exc}", culprit=str(path)) from exc
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{path}: not UTF-8 text: {exc}", culprit=str(path)) from exc


def _read_lines(path: Path) -> list[bytes]:
    """The file's lines, undecoded (split on ``\\n``, ``\\r\\n`` or ``\\r``)."""
    try:
        return path.read_bytes().splitlines()
    except OSError as exc:
        raise InvalidInputError(f"{path}: cannot read: {exc}", culprit=str(path)) from exc


def _decode(raw: bytes) -> str:
    """One line as text: a line that is not UTF-8 is one bad row, the rest of the file stays readable."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _BadRow(f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at column {exc.start + 1}") from None


def _csv_row(raw: bytes) -> list[str]:
    try:
        return next(csv.reader((_decode(raw),)), [])
    except csv.Error as exc:
        raise _BadRow(f"not CSV: {exc}") from None


def read_azure(path: str | Path, *, tenant_id: str, model: str, sla_class: str = "standard",
               skip_bad: bool = False, limit: int | None = None) -> ReadResult:
    """Read an Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    ``arrival_s`` is seconds since the first good row's timestamp (100-ns resolution kept);
    ``request_id`` is ``"{tenant_id}:{line_number}"``. ``limit`` caps the number of requests
    returned (``None``: all). Blank lines are ignored.
    """
    path = Path(path)
    _check_limit(limit)
    lines = _read_lines(path)
    try:
        header = _csv_row(lines[0]) if lines else None
    except _BadRow as exc:
        raise InvalidInputError(f"{path}:1: {exc}", culprit=f"{path}:1") from None
    if header is None or [h.strip() for h in header] != list(_AZURE_COLUMNS):
        raise InvalidInputError(f"{path}:1: expected header {','.join(_AZURE_COLUMNS)}, got {header}",
                                culprit=f"{path}:1")
    sink = _BadLineSink(path, skip_bad)
    requests: list[RequestSpec] = []
    first: tuple[int, float] | None = None
    last_s = 0.0
    for line_no, raw in enumerate(lines[1:], start=2):
        if not raw:
            continue
        if limit is not None and len(requests) >= limit:
            break
        try:
            row = _csv_row(raw)
            if len(row) != 3:
                raise _BadRow(f"expected 3 columns, got {len(row)}")
            day, sec = _azure_time(row[0])
            prompt_tokens = _positive_int(row[1], "ContextTokens")
            output_tokens = _positive_int(row[2], "GeneratedTokens")
            if first is None:
                first = (day, sec)
            # subtract day and seconds separately: an absolute float would lose the 100-ns digits
            arrival_s = (day - first[0]) * 86400 + (sec - first[1])
            if arrival_s < last_s:
                raise _BadRow(f"TIMESTAMP goes backwards ({arrival_s:.7f} s < previous {last_s:.7f} s)")
        except _BadRow as exc:
            sink.report(line_no, str(exc))
            continue
        last_s = arrival_s
        requests.append(RequestSpec(f"{tenant_id}:{line_no}", tenant_id, model, arrival_s,
                                    prompt_tokens, output_tokens, sla_class))
    return ReadResult(str(path), requests, sink.num_bad, sink.bad_lines)


def _json_count(obj: dict[str, object], key: str) -> int:
    value = obj.get(key)
    if type(value) is not int:  # bool is an int subclass, and 3.0 is not a token count
        raise _BadRow(f"{key} is missing or not an integer: {value!r}")
    if value < 1:
        raise _BadRow(f"{key} must be >= 1, got {value}")
    return value


def read_mooncake(path: str | Path, *, tenant_id: str, model: str, sla_class: str = "standard",
                  skip_bad: bool = False, limit: int | None = None,
                  block_tokens: int | None = MOONCAKE_BLOCK_TOKENS) -> ReadResult:
    """Read a Mooncake trace (JSON lines: ``timestamp`` in ms, ``input_length``, ``output_length``,
    ``hash_ids``).

    ``arrival_s`` is ``timestamp / 1000`` (already relative to the trace start); ``hash_ids``
    become ``prefix_hashes``. With ``block_tokens`` set, a row whose ``len(hash_ids)`` is not
    ``ceil(input_length / block_tokens)`` is malformed; ``None`` skips that check.
    """
    path = Path(path)
    _check_limit(limit)
    lines = _read_lines(path)
    sink = _BadLineSink(path, skip_bad)
    requests: list[RequestSpec] = []
    last_s = 0.0
    for line_no, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        if limit is not None and len(requests) >= limit:
            break
        try:
            line = _decode(raw)
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _BadRow(f"not JSON: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise _BadRow("not a JSON object")
            ts_ms = obj.get("timestamp")
            if isinstance(ts_ms, bool) or not isinstance(ts_ms, int | float) or not (0 <= ts_ms < math.inf):
                raise _BadRow(f"timestamp is missing or not a finite number >= 0: {ts_ms!r}")
            arrival_s = ts_ms / 1000.0
            prompt_tokens = _json_count(obj, "input_length")
            output_tokens = _json_count(obj, "output_length")
            hash_ids = obj.get("hash_ids", [])
            if not isinstance(hash_ids, list) or any(type(h) is not int for h in hash_ids):
                raise _BadRow("hash_ids is not a list of integers")
            if block_tokens is not None and len(hash_ids) != -(-prompt_tokens // block_tokens):
                raise _BadRow(f"{len(hash_ids)} hash_ids for {prompt_tokens} tokens "
                              f"(expected one per {block_tokens}-token block)")
            if arrival_s < last_s:
                raise _BadRow(f"timestamp goes backwards ({ts_ms} ms < previous {last_s * 1000:g} ms)")
        except _BadRow as exc:
            sink.report(line_no, str(exc))
            continue
        last_s = arrival_s
        requests.append(RequestSpec(f"{tenant_id}:{line_no}", tenant_id, model, arrival_s,
                                    prompt_tokens, output_tokens, sla_class, tuple(hash_ids)))
    return ReadResult(str(path), requests, sink.num_bad, sink.bad_lines)


def _read_rate_windows(path: Path) -> tuple[float, tuple[RateWindow, ...]]:
    """A ServeGen ``chunk-N-trace.csv``: ``window_start_s,rate,cv,pattern,shape,scale``, no header."""
    windows: list[RateWindow] = []
    for line_no, row in enumerate(csv.reader(_open_text(path).splitlines()), start=1):
        if not row:
            continue
        where = f"{path}:{line_no}"
        if len(row) != 6:
            raise InvalidInputError(f"{where}: expected 6 columns, got {len(row)}", culprit=where)
        try:
            start_s, rate_rps, cv, shape, scale = (float(row[i]) for i in (0, 1, 2, 4, 5))
        except ValueError:
            raise InvalidInputError(f"{where}: a numeric column is not a number: {row}", culprit=where) from None
        pattern = row[3].strip()
        if pattern and pattern not in _SERVEGEN_LAWS:
            raise InvalidInputError(f"{where}: unknown inter-arrival pattern {pattern!r}", culprit=where)
        try:
            windows.append(RateWindow(start_s, rate_rps, cv, _SERVEGEN_LAWS.get(pattern), shape, scale))
        except InvalidInputError as exc:
            raise InvalidInputError(f"{where}: {exc}", culprit=where) from None
    if len(windows) < 2:
        raise InvalidInputError(f"{path}: needs at least two rate windows, got {len(windows)}", culprit=str(path))
    return windows[1].start_s - windows[0].start_s, tuple(windows)


def _parse_pmf(text: str, where: str) -> Pmf | None:
    """A PMF stored as a Python dict literal string ``"{value: prob, ...}"`` of plain numbers;
    ``"{}"`` gives None."""
    # split by hand rather than ast.literal_eval: 6x faster on the 430k entries, and no less strict
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise InvalidInputError(f"{where}: not a {{number: probability}} dict literal", culprit=where)
    body = body[1:-1].strip()
    if not body:
        return None
    items: list[tuple[float, float]] = []
    try:
        for item in body.split(","):
            value_text, sep, prob_text = item.partition(":")
            if not sep:
                raise ValueError(item)
            items.append((float(value_text), float(prob_text)))
    except ValueError:
        raise InvalidInputError(f"{where}: not a {{number: probability}} dict literal", culprit=where) from None
    items.sort()
    if any(not math.isfinite(v) or v < 0 for v, _ in items):
        raise InvalidInputError(f"{where}: values must be finite and >= 0", culprit=where)
    if any(items[i][0] == items[i - 1][0] for i in range(1, len(items))):
        raise InvalidInputError(f"{where}: a value appears twice", culprit=where)
    try:
        return Pmf(tuple(v for v, _ in items), tuple(p for _, p in items))
    except InvalidInputError as exc:
        raise InvalidInputError(f"{where}: {exc}", culprit=where) from None


def _read_length_windows(path: Path) -> tuple[LengthWindow, ...]:
    """A ServeGen ``chunk-N-dataset.json``: ``{window_start_s: {field: "<dict literal>"}}``."""
    try:
        doc = json.loads(_open_text(path))
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"{path}:{exc.lineno}: not JSON: {exc.msg}", culprit=str(path)) from None
    if not isinstance(doc, dict) or not doc:
        raise InvalidInputError(f"{path}: expected a non-empty object keyed by window start", culprit=str(path))
    windows: list[LengthWindow] = []
    for key, fields in doc.items():
        try:
            start_s = float(key)
        except ValueError:
            raise InvalidInputError(f"{path}: window key {key!r} is not a number", culprit=str(path)) from None
        if not isinstance(fields, dict):
            raise InvalidInputError(f"{path}: window {key} is not an object", culprit=str(path))
        pmfs: dict[str, Pmf] = {}
        for name, text in fields.items():
            if not isinstance(text, str):
                raise InvalidInputError(f"{path}: window {key} field {name} is not a string", culprit=str(path))
            pmf = _parse_pmf(text, f"{path}: window {key} field {name}")
            if pmf is not None:
                pmfs[name] = pmf
        # a window either has traffic (every field) or none; a partial one is not interpretable
        if pmfs and len(pmfs) != len(fields):
            raise InvalidInputError(f"{path}: window {key} has only some of its PMFs empty", culprit=str(path))
        windows.append(LengthWindow(start_s, pmfs))
    windows.sort(key=lambda w: w.start_s)
    return tuple(windows)


def read_trace(path: str, fmt: str, *, skip_bad: bool, tenant_id: str = "trace",
               model: str = "llama2-7b") -> ReadResult:
    """Read an Azure CSV or Mooncake JSONL trace (``fmt`` auto: by extension)."""
    if fmt == "auto":
        fmt = "mooncake" if path.endswith((".jsonl", ".json")) else "azure"
    reader = {"azure": read_azure, "mooncake": read_mooncake}.get(fmt)
    if reader is None:
        raise InvalidInputError(f"unknown trace format {fmt!r} (azure, mooncake)")
    return reader(path, tenant_id=tenant_id, model=model, skip_bad=skip_bad)


def read_servegen_clients(folder: str | Path) -> list[ClientStats]:
    """Read every ServeGen client (``chunk-N-trace.csv`` plus ``chunk-N-dataset.json``) of one
    model folder, e.g. ``servegen/reason/deepseek-r1``; ordered by chunk number.

    ``client_id`` is ``"chunk-N"`` and ``source`` the folder name. Rate windows are the CSV rows
    (600 s each in the public data); length windows are the JSON keys (21,600 s each). A chunk
    without its dataset file, or a folder without chunks, raises ``InvalidInputError``.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise InvalidInputError(f"{folder}: not a directory", culprit=str(folder))
    chunks = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _CHUNK_RE.match(p.name)))
    if not chunks:
        raise InvalidInputError(f"{folder}: no chunk-N-trace.csv files", culprit=str(folder))
    clients: list[ClientStats] = []
    for number, trace_path in chunks:
        dataset_path = folder / f"chunk-{number}-dataset.json"
        if not dataset_path.is_file():
            raise InvalidInputError(f"{dataset_path}: missing (needed by {trace_path.name})", culprit=str(dataset_path))
        window_s, rate_windows = _read_rate_windows(trace_path)
        length_windows = _read_length_windows(dataset_path)
        length_window_s = (length_windows[1].start_s - length_windows[0].start_s if len(length_windows) > 1
                           else _SERVEGEN_LENGTH_WINDOW_S)
        try:
            clients.append(ClientStats(f"chunk-{number}", folder.name, window_s, rate_windows,
                                       length_window_s, length_windows))
        except InvalidInputError as exc:
            raise InvalidInputError(f"{trace_path}: {exc}", culprit=str(trace_path)) from None
    return clients
