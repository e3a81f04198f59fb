"""Request traces: when each request arrived and how long its prompt and answer were.

Three public formats, told apart by their first line (or named):

- `mooncake`: JSON Lines as Kimi's Mooncake traces ship them (`kvcache-ai/Mooncake`,
  `FAST25-release/traces/*.jsonl`): `timestamp` (milliseconds from the start), `input_length`,
  `output_length` (tokens) and `hash_ids`, one id per 512-token block of the prompt. Ids are
  prefix hashes: two requests whose lists start alike share that much of their prompt.
- `azure`: the Azure LLM inference traces (`Azure/AzurePublicDataset`, 2023 and 2024), CSV with
  the header `TIMESTAMP,ContextTokens,GeneratedTokens`; `TIMESTAMP` is a date and time
  (`2023-11-16 18:15:46.6805900`). No prefix information: every prompt is its own.
- `burstgpt`: BurstGPT (`HPMLL/BurstGPT`), CSV with `Timestamp` (seconds), `Request tokens` and
  `Response tokens` among its columns; a row with 0 response tokens is a failed request.

Each row becomes a `TraceRow`: its line, its arrival offset in seconds after the trace's first
row, its lengths and its prefix blocks. `read_trace` reads the rows of a window (`start_s`,
`seconds`) and, optionally, a sample of them (`sample = (k, r)`: the conversations, or rows,
whose key is r modulo k), checking every row it reads: a missing column, a timestamp earlier than
the line before, a negative or non-integer length, a truncated line, or hash ids that do not
cover the prompt stop it with `TraceError`, one line naming the file and the line. Rows with no
output (0 tokens: a request that failed when the trace was recorded) are skipped and counted.
Reading stops at the end of the window, so a week-long trace costs only what the window holds,
and a file with more than `MAX_ROWS` rows in the window is refused.
"""

from __future__ import annotations

import csv
import math
import re
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import msgspec

from common.json_errors import JSON_DECODE_ERRORS

__all__ = [
    "BLOCK_TOKENS",
    "FORMATS",
    "MAX_ROWS",
    "Trace",
    "TraceError",
    "TraceRow",
    "TraceSelection",
    "parse_sample",
    "parse_window",
    "read_trace",
]

FORMATS = ("auto", "mooncake", "azure", "burstgpt")
BLOCK_TOKENS = 512  # Mooncake's hash-id block (its README; AIPerf's mooncake loader uses the same)
MAX_ROWS = 1_000_000  # rows one replay holds in memory; a longer trace needs a window
NO_OUTPUT = "no output tokens (failed when recorded)"


class TraceError(ValueError):
    """A trace that cannot be replayed; the message is one line naming the file and the line."""


class TraceRow(msgspec.Struct, frozen=True, array_like=True):
    """One request of a trace. `at_s`: seconds after the window's start (the trace's first row
    without a window). `blocks`: Mooncake's prefix block ids, empty for formats without them."""

    line: int
    at_s: float
    input_tokens: int
    output_tokens: int
    blocks: tuple[int, ...] = ()

    @property
    def session_key(self) -> int:
        """What a sample keeps together: the second block id (the conversation after Mooncake's
        shared first block, `hash_ids[0]`), else the first, else the line."""
        if len(self.blocks) > 1:
            return self.blocks[1]
        return self.blocks[0] if self.blocks else self.line


class TraceSelection(msgspec.Struct, frozen=True, kw_only=True):
    """Which part of a trace to replay and how fast (the command line's --trace-* options)."""

    format: str = "auto"
    start_s: float = 0.0  # window start, seconds after the first row
    seconds: float | None = None  # window length (None: to the end)
    speedup: float = 1.0  # replay this many times faster than recorded
    sample: tuple[int, int] | None = None  # keep rows whose session_key % k == r

    def validate(self) -> None:
        if self.format not in FORMATS:
            raise TraceError(f"trace format {self.format!r}: one of {', '.join(FORMATS)}")
        if not (0.0 <= self.start_s < math.inf) or (self.seconds is not None and not 0 < self.seconds < math.inf):
            raise TraceError("trace window: START >= 0 and SECONDS > 0")
        if not 0 < self.speedup < math.inf:
            raise TraceError(f"trace speed-up must be > 0, got {self.speedup!r}")
        if self.sample is not None and not 0 <= self.sample[1] < self.sample[0]:
            raise TraceError(f"trace sample K:R needs 0 <= R < K, got {self.sample[0]}:{self.sample[1]}")


class Trace(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    format: str
    rows: tuple[TraceRow, ...]
    selection: TraceSelection
    window_s: float  # trace seconds the rows stand for: the window, or the span of the rows read
    skipped: dict[str, int] = {}

    @property
    def replay_s(self) -> float:
        """Seconds the replay lasts at its speed-up (arrivals; answers may run longer)."""
        return self.window_s / self.selection.speedup

    def due_s(self, row: TraceRow) -> float:
        """When `row` is sent, seconds after the replay starts."""
        return row.at_s / self.selection.speedup


def parse_window(text: str) -> tuple[float, float]:
    """`START:SECONDS` (trace seconds) -> (start, seconds)."""
    start, sep, length = text.partition(":")
    try:
        a, b = float(start), float(length)
    except ValueError:
        a = b = math.nan
    if not sep or not (0 <= a < math.inf and 0 < b < math.inf):
        raise TraceError(f"--trace-window {text!r}: START:SECONDS, e.g. 600:600 (START >= 0, SECONDS > 0)")
    return a, b


def parse_sample(text: str) -> tuple[int, int]:
    """`K:R` -> (k, r): keep the conversations whose key is r modulo k."""
    k, sep, r = text.partition(":")
    if not sep or not (k.isdigit() and r.isdigit()) or not 0 <= int(r) < int(k):
        raise TraceError(f"--trace-sample {text!r}: K:R with 0 <= R < K, e.g. 2:0 (every second conversation)")
    return int(k), int(r)


def read_trace(path: str | Path, selection: TraceSelection | None = None) -> Trace:
    """The rows of `selection`'s window (and sample) of the trace at `path`, checked."""
    sel = selection or TraceSelection()
    sel.validate()
    where = str(path)
    try:
        f = open(path, encoding="utf-8", newline="")  # noqa: SIM115 (closed below, after the format is known)
    except OSError as e:
        raise TraceError(f"{where}: cannot read trace: {e.strerror or e}") from None
    with f:
        try:
            fmt = sel.format if sel.format != "auto" else _detect(f, where)
            f.seek(0)
            raw = _mooncake(f, where) if fmt == "mooncake" else _csv(f, where, fmt)
            return _select(raw, sel, where, fmt)
        except UnicodeDecodeError as e:
            raise TraceError(f"{where}: not UTF-8 text ({e.reason})") from None


# --- formats ------------------------------------------------------------------------------------

_AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_BURSTGPT = ("Timestamp", "Request tokens", "Response tokens")


def _detect(f: TextIO, where: str) -> str:
    for lineno, line in enumerate(f, 1):
        text = line.strip()
        if not text:
            continue
        if text.startswith("{"):
            return "mooncake"
        names = {c.strip().lower() for c in text.split(",")}
        if {c.lower() for c in _AZURE} <= names:
            return "azure"
        if {c.lower() for c in _BURSTGPT} <= names:
            return "burstgpt"
        raise TraceError(
            f"{where}:{lineno}: cannot tell the trace format (a Mooncake JSON object, or a CSV header with "
            f"{','.join(_AZURE)} or {','.join(_BURSTGPT)}); name it with --trace-format"
        )
    raise TraceError(f"{where}: empty trace")


# (line, timestamp in seconds, input, output, blocks); the timestamp is the format's own origin
_Raw = tuple[int, float, int, int, tuple[int, ...]]


class _MooncakeLine(msgspec.Struct, forbid_unknown_fields=False):
    timestamp: int | float | None = None
    input_length: int | float | None = None
    output_length: int | float | None = None
    hash_ids: list[int] | None = None


_mooncake_decoder = msgspec.json.Decoder(_MooncakeLine)
_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def _mooncake(f: TextIO, where: str) -> Iterator[_Raw]:
    for lineno, line in enumerate(f, 1):
        if not line.strip():
            continue
        at = f"{where}:{lineno}"
        try:
            item = _mooncake_decoder.decode(line)
        except msgspec.ValidationError as e:
            raise TraceError(f"{at}: {_json_reason(e)}") from None
        except JSON_DECODE_ERRORS as e:
            raise TraceError(f"{at}: not a complete JSON object ({_json_reason(e)}): truncated line?") from None
        missing = [k for k in _MOONCAKE_KEYS if getattr(item, k) is None]
        if missing:
            raise TraceError(f"{at}: missing column {missing[0]!r} (Mooncake needs {', '.join(_MOONCAKE_KEYS)})")
        assert item.timestamp is not None and item.input_length is not None and item.output_length is not None
        assert item.hash_ids is not None
        inp, out = _length(at, "input_length", item.input_length), _length(at, "output_length", item.output_length)
        need = -(-inp // BLOCK_TOKENS)
        if len(item.hash_ids) != need:
            raise TraceError(
                f"{at}: {len(item.hash_ids)} hash_ids for input_length {inp}: one per {BLOCK_TOKENS}-token block "
                f"makes {need}"
            )
        yield lineno, _finite(at, "timestamp", item.timestamp) / 1000.0, inp, out, tuple(item.hash_ids)


def _json_reason(e: Exception) -> str:
    return re.sub(r"\s+", " ", str(e)).strip()


def _csv(f: TextIO, where: str, fmt: str) -> Iterator[_Raw]:
    want = _AZURE if fmt == "azure" else _BURSTGPT
    reader = csv.reader(f)
    header: list[str] | None = None
    cols: list[int] = []
    for fields in reader:
        lineno = reader.line_num
        if not fields or all(not x.strip() for x in fields):
            continue
        if header is None:
            header = [x.strip() for x in fields]
            lower = [h.lower() for h in header]
            for name in want:
                if name.lower() not in lower:
                    raise TraceError(f"{where}:{lineno}: missing column {name!r} (the header has: {', '.join(header)})")
                cols.append(lower.index(name.lower()))
            continue
        at = f"{where}:{lineno}"
        if len(fields) < len(header):
            raise TraceError(f"{at}: {len(fields)} fields, the header has {len(header)}: truncated line?")
        ts_text, inp_text, out_text = (fields[c].strip() for c in cols)
        for name, value in zip(want, (ts_text, inp_text, out_text), strict=True):
            if not value:
                raise TraceError(f"{at}: empty {name!r}: truncated line?")
        ts = _datetime_s(at, ts_text) if fmt == "azure" else _finite(at, want[0], _number(at, want[0], ts_text))
        inp = _length(at, want[1], _number(at, want[1], inp_text))
        out = _length(at, want[2], _number(at, want[2], out_text))
        yield lineno, ts, inp, out, ()
    if header is None:
        raise TraceError(f"{where}: empty trace")


def _number(at: str, name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise TraceError(f"{at}: {name} {text!r} is not a number") from None


def _finite(at: str, name: str, value: float) -> float:
    if not math.isfinite(value):
        raise TraceError(f"{at}: {name} {value!r} is not a finite number")
    return float(value)


def _length(at: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise TraceError(f"{at}: {name} {value!r} is not a whole number of tokens")
    if value < 0:
        raise TraceError(f"{at}: {name} {int(value)} is negative")
    return int(value)


_EPOCH = datetime(1970, 1, 1)


def _datetime_s(at: str, text: str) -> float:
    """`2023-11-16 18:15:46.6805900` -> seconds (any origin: only differences are used). The
    fraction may have more digits than `datetime` takes (the 2023 traces have seven)."""
    main, _, frac = text.partition(".")
    try:
        t = datetime.fromisoformat(main)
        if not frac.isdigit() and frac:
            raise ValueError
    except ValueError:
        example = "2023-11-16 18:15:46.6805900"
        raise TraceError(f"{at}: TIMESTAMP {text!r} is not a date and time (e.g. {example})") from None
    whole = t.timestamp() if t.tzinfo is not None else (t - _EPOCH).total_seconds()
    return whole + (float("0." + frac) if frac else 0.0)


# --- selection ----------------------------------------------------------------------------------


def _select(raw: Iterator[_Raw], sel: TraceSelection, where: str, fmt: str) -> Trace:
    rows: list[TraceRow] = []
    skipped: Counter[str] = Counter()
    first: float | None = None
    prev: tuple[int, float] | None = None
    end = sel.start_s + sel.seconds if sel.seconds is not None else math.inf
    last_offset = 0.0
    for lineno, ts, inp, out, blocks in raw:
        if prev is not None and ts < prev[1]:
            raise TraceError(
                f"{where}:{lineno}: timestamp goes back ({_show(fmt, ts)} after {_show(fmt, prev[1])} on line "
                f"{prev[0]}): a trace is in arrival order"
            )
        if inp < 1:
            raise TraceError(f"{where}:{lineno}: input length 0: a request has a prompt")
        prev = (lineno, ts)
        if first is None:
            first = ts
        offset = ts - first
        if offset >= end:
            break  # arrival order: nothing later is in the window
        last_offset = offset
        if offset < sel.start_s:
            continue
        row = TraceRow(lineno, offset - sel.start_s, inp, out, blocks)
        if sel.sample is not None and row.session_key % sel.sample[0] != sel.sample[1]:
            continue
        if out < 1:
            skipped[NO_OUTPUT] += 1
            continue
        rows.append(row)
        if len(rows) > MAX_ROWS:
            raise TraceError(f"{where}: more than {MAX_ROWS:,} requests in the window: choose a shorter --trace-window")
    if first is None:
        raise TraceError(f"{where}: no requests in the trace")
    if not rows:
        span = f"{sel.start_s:g}:{sel.seconds:g}" if sel.seconds is not None else f"from {sel.start_s:g} s"
        raise TraceError(f"{where}: no requests in the window {span} (the trace spans {last_offset:g} s)")
    window = sel.seconds if sel.seconds is not None else max(last_offset - sel.start_s, rows[-1].at_s)
    return Trace(path=where, format=fmt, rows=tuple(rows), selection=sel, window_s=window, skipped=dict(skipped))


def _show(fmt: str, seconds: float) -> str:
    return f"{seconds * 1000:g} ms" if fmt == "mooncake" else f"{seconds:.7g} s"
