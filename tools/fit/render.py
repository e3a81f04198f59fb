"""A profile document as TOML text: the header (what was not measured, what the format cannot
hold), the tables, then `[provenance]`."""

from __future__ import annotations

import json
from typing import Any

from tools.fit.schema import Document

__all__ = ["render_profile"]


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a TOML basic string
    raise TypeError(f"no TOML form for {v!r}")


def render_profile(doc: Document, header: list[str]) -> str:
    lines = [f"# {h}" for h in header]
    if doc.not_measured:
        lines += ["#", "# Not measured (the twin's default applies, or the value says why):"]
        lines += [f"# - {n}" for n in doc.not_measured]
    if doc.findings:
        lines += ["#", "# Measured, with no parameter in the profile:"]
        lines += [f"# - {n}" for n in doc.findings]
    tables = {k: v for k, v in doc.tables.items() if isinstance(v, dict)}
    for key, value in doc.tables.items():
        if not isinstance(value, dict):
            lines.append(f"{key} = {_value(value)}")
    for name, table in tables.items():
        lines += ["", f"[{name}]"]
        lines += [f"{k} = {_value(v)}" for k, v in table.items()]
    lines += ["", "[provenance]"]
    lines += [f"{json.dumps(k)} = {_value(v)}" for k, v in doc.provenance.items()]
    return "\n".join(lines) + "\n"
