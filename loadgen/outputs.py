"""Files in `--output DIR`: summary.json, summary.csv, requests.jsonl (and plots, see plots.py).

They are rewritten after every finished level, so an interrupted or failed run still leaves the
results of the levels it finished.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

import msgspec

from loadgen.summary import Level, RequestRecord, Summary

_encoder = msgspec.json.Encoder()

CSV_RUN_FIELDS = ("target", "url", "model", "dataset")
_DICT_FIELDS = ("backends", "errors", "domains", "accept_length_by_domain")


class OutputDir:
    """Owns the output directory of one invocation."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self._requests = path / "requests.jsonl"
        self._requests.write_bytes(b"")

    def add_requests(self, records: Iterable[RequestRecord]) -> None:
        with self._requests.open("ab") as f:
            for r in records:
                f.write(_encoder.encode(r) + b"\n")

    def write_json(self, name: str, obj: object) -> None:
        """Any msgspec-encodable object as indented JSON (e.g. a study's `study.json`)."""
        _atomic_write(self.path / name, msgspec.json.format(_encoder.encode(obj), indent=2) + b"\n")

    def write_summary(self, summary: Summary) -> None:
        data = msgspec.json.format(_encoder.encode(summary), indent=2)
        _atomic_write(self.path / "summary.json", data + b"\n")
        _atomic_write(self.path / "summary.csv", summary_csv(summary).encode())


def summary_csv(summary: Summary) -> str:
    """One row per (target, level); dict fields as `name=count;...`."""
    import io

    level_fields = Level.__struct_fields__
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow((*CSV_RUN_FIELDS, *level_fields))
    for run in summary.runs:
        for lv in run.levels:
            row: list[object] = [run.target, run.url, run.model or "", run.dataset]
            for name in level_fields:
                v = getattr(lv, name)
                if name == "goodput" and v is not None:  # the figure and its share; the SLOs are in summary.json
                    v = f"request_goodput={v.request_goodput:.4g};slo_attainment={v.slo_attainment:.4g}"
                if name in _DICT_FIELDS:
                    v = ";".join(f"{k}={n:.4g}" if isinstance(n, float) else f"{k}={n}" for k, n in sorted(v.items()))
                row.append("" if v is None else v)
            w.writerow(row)
    return buf.getvalue()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
