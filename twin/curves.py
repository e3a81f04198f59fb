"""`specroute sim curves`: per profile, per-request and aggregate tok/s versus concurrency.

Computed with the engine on a virtual clock (closed loop, exactly C requests in flight), so the
whole table takes about a second. This documents the behaviour the studies did not measure:
where speculation's gain shrinks with concurrency, and where DDTree's budget stops paying.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

import msgspec

from twin.profile import Profile, ProfileError, list_profiles, load_profile
from twin.virtual import LevelResult, run_closed_loop

__all__ = ["CurveRow", "compute_curves", "main", "DEFAULT_LEVELS"]

DEFAULT_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48)


class CurveRow(msgspec.Struct, frozen=True):
    profile: str
    concurrency: int
    per_request_tps: float
    aggregate_tps: float
    accept_length: float
    speedup_vs_ar: float | None  # aggregate vs the same model's AR profile at the same C


def _ar_profile_for(profile: Profile) -> Profile | None:
    name = {"kimi-k2.6": "k26-ar", "qwen3.6-27b": "qwen36-ar"}.get(profile.served_model_name)
    if name is None or profile.name == "zero":
        return None
    return load_profile(name)


def _level(profile: Profile, c: int, max_tokens: int, domain: str | None, seed: int) -> LevelResult:
    # distinct prompts: an NGRAM server would replay a repeated greedy prompt (twin/ngram.py)
    return run_closed_loop(profile, c, max(4 * c, 8), max_tokens, domain=domain, seed=seed, distinct=True)


def compute_curves(
    profiles: list[Profile],
    levels: tuple[int, ...] = DEFAULT_LEVELS,
    max_tokens: int = 512,
    domain: str | None = None,
    seed: int = 0,
) -> list[CurveRow]:
    """Rows for every profile and level; speedup relative to the model's AR profile."""
    rows: list[CurveRow] = []
    ar_cache: dict[tuple[str, int], float] = {}
    for prof in profiles:
        ar = _ar_profile_for(prof)
        for c in levels:
            res = _level(prof, c, max_tokens, domain, seed)
            speedup = None
            if ar is not None:
                key = (ar.name, c)
                if key not in ar_cache:
                    ar_cache[key] = _level(ar, c, max_tokens, domain, seed).output_throughput
                speedup = res.output_throughput / ar_cache[key]
            rows.append(
                CurveRow(
                    prof.name, c, res.mean_request_output_throughput, res.output_throughput, res.accept_length, speedup
                )
            )
    return rows


def render_markdown(rows: list[CurveRow]) -> str:
    out = [
        "| profile | C | per-request tok/s | aggregate tok/s | accept length | vs AR |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        sp = f"{r.speedup_vs_ar:.2f}x" if r.speedup_vs_ar is not None else "-"
        acc = f"{r.accept_length:.2f}" if r.accept_length else "-"
        out.append(
            f"| {r.profile} | {r.concurrency} | {r.per_request_tps:.1f} | {r.aggregate_tps:.1f} | {acc} | {sp} |"
        )
    return "\n".join(out)


def render_rich(rows: list[CurveRow], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("profile", "C", "per-request tok/s", "aggregate tok/s", "accept len", "vs AR"):
        table.add_column(col, justify="left" if col == "profile" else "right")
    last = None
    for r in rows:
        if last is not None and r.profile != last:
            table.add_section()
        last = r.profile
        table.add_row(
            r.profile,
            str(r.concurrency),
            f"{r.per_request_tps:.1f}",
            f"{r.aggregate_tps:.1f}",
            f"{r.accept_length:.2f}" if r.accept_length else "-",
            f"{r.speedup_vs_ar:.2f}x" if r.speedup_vs_ar is not None else "-",
        )
    Console().print(table)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"specroute sim curves: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str]) -> int:
    p = _Parser(prog="specroute sim curves", description="per-request and aggregate tok/s per profile (virtual clock)")
    p.add_argument("--profile", action="append", help="profile(s); default: all but zero")
    p.add_argument("--concurrency", default=",".join(map(str, DEFAULT_LEVELS)))
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--domain", choices=["math", "code", "chat"], help="prompt domain; default: a mix of all three")
    p.add_argument("--budgets", help="DDTree budgets to sweep (e.g. 8,16,32,64,128)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", choices=["table", "markdown", "json"], default="table")
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        levels = tuple(int(x) for x in args.concurrency.split(","))
        if any(c < 1 for c in levels) or args.max_tokens < 1:
            raise ValueError
    except ValueError:
        print(
            "specroute sim curves: error: --concurrency takes positive integers like 1,8,32 "
            "and --max-tokens a positive integer",
            file=sys.stderr,
        )
        return 2
    try:
        profiles = (
            [load_profile(n) for n in args.profile]
            if args.profile
            else [x for x in list_profiles() if x.name != "zero"]
        )
        if args.budgets:
            swept = []
            for prof in profiles:
                for b in (int(x) for x in args.budgets.split(",")):
                    q = prof.with_budget(b)
                    swept.append(msgspec.structs.replace(q, name=f"{prof.name}@b{b}"))
            profiles = swept
    except (ProfileError, ValueError) as e:
        print(f"specroute sim curves: error: {e}", file=sys.stderr)
        return 2
    rows = compute_curves(profiles, levels, args.max_tokens, args.domain, args.seed)
    if args.format == "markdown":
        print(render_markdown(rows))
    elif args.format == "json":
        print(msgspec.json.encode(rows).decode())
    else:
        dom = args.domain or "mixed"
        render_rich(rows, f"twin curves: {args.max_tokens}-token outputs, {dom} prompts, closed loop, virtual clock")
    return 0
