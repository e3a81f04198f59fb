"""What a fit prints: each part's points against the fitted law (the residuals), what was not fitted."""

from __future__ import annotations

from tools.fit.fitted import FitResult

__all__ = ["render_report"]


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def render_report(fit: FitResult) -> str:
    out: list[str] = []
    m = fit.measurements
    f = m.facts
    c = f.classification
    out.append(
        f"\n== fit of {m.url}: {f.served_model_name}, {c.strategy if c else '?'} "
        f"({c.reported if c and c.reported else 'no speculation'}), cap {f.max_running_requests}, {m.mode} sweep, "
        f"{len(m.levels)} rounds, {m.wall_s:.0f} s"
    )
    if m.stopped:
        out.append(f"the sweep stopped early: {m.stopped}")
    s = fit.step
    if s is not None:
        out.append(
            f"\nstep time: {s.const_ms:.2f} ms + {s.per_seq_ms:.4f} ms per sequence + {s.kv_ns_per_token:.1f} ns per "
            f"KV token"
            + (f" + {s.compute_ms_per_token:.4f} ms per token past {s.knee_tokens}" if s.knee_tokens else "")
            + f" ({s.source}); rms {100 * s.rms:.2f}%, worst {100 * s.worst:.2f}%"
        )
        out.append(
            f"  {'round':8s} {'C':>4s} {'batch':>6s} {'KV tokens':>10s} {'steps':>6s} {'ms':>8s} {'fit ms':>8s} "
            f"{'error':>7s}"
        )
        for sp, q in zip(s.points, s.predicted_ms, strict=True):
            out.append(
                f"  {sp.kind:8s} {sp.concurrency:4d} {sp.batch:6.2f} {sp.kv_tokens:10,.0f} {sp.steps:6d} "
                f"{sp.step_ms:8.2f} {q:8.2f} {_pct(q / sp.step_ms - 1):>7s}"
            )
    p = fit.prefill
    if p is not None:
        out.append(
            f"\nprefill alone: {p.base_ms:.1f} ms a step + {p.per_token_ms:.4f} ms per token + "
            f"{p.attn_ms_per_mpair:.3f} ms per million causal pairs ({p.source}); rms {100 * p.rms:.2f}%, "
            f"worst {100 * p.worst:.2f}%"
        )
        out.append(f"  {'tokens':>8s} {'s':>8s} {'fit s':>8s} {'error':>7s}")
        for pt, q in zip(p.points, p.predicted_s, strict=True):
            out.append(f"  {pt.tokens:8,d} {pt.seconds:8.3f} {q:8.3f} {_pct(q / pt.seconds - 1):>7s}")
    a = fit.accept
    if a is not None:
        out.append(
            f"\nacceptance (per draft, T=0, short prompts, up to {a.max_drafts} drafts a pass): "
            + ", ".join(f"{d} {v:.4f}" for d, v in a.accept.items())
            + f"; prompt spread {a.spread:.2f}{'' if a.spread_measured else ' (not measured)'}; cells' rms "
            f"{100 * a.residual:.2f}%"
        )
        out.append(f"  {'domain':6s} {'T':>4s} {'requests':>8s} {'drafts/pass':>11s} {'miss':>7s}")
        for cell in a.cells:
            out.append(
                f"  {cell.domain:6s} {cell.temperature:4g} {cell.requests:8d} {cell.mean_drafts:11.3f} {cell.miss:7.4f}"
            )
        if a.temperature:
            out.append(
                "  miss-rate factor at T=1: " + ", ".join(f"{d} {v:.3f}" for d, v in sorted(a.temperature.items()))
            )
        if a.context:
            out.append(
                "  miss-rate factor by prompt tokens: "
                + ", ".join(f"{n:,} {g:.3f}" for n, g in sorted(a.context.items()))
            )
        if fit.window is not None:
            out.append(
                f"  window law: {fit.window.per_doubling:.3f} per doubling past {fit.window.window:,} tokens "
                f"(rms {fit.window.rms:.3f})"
            )
        if fit.copy is not None:
            out.append(
                f"  inside copies of its own output (NGRAM): {fit.copy.accept:.4f} per draft, "
                f"{fit.copy.mean_drafts:.2f} drafts a pass over {fit.copy.requests} requests"
            )
        if a.thinking_miss_ratio:
            out.append(
                "  thinking on / off miss rate (T=0.6): "
                + ", ".join(f"{d} x{v:.2f}" for d, v in sorted(a.thinking_miss_ratio.items()))
            )
    for label, lf in (("reasoning", fit.reasoning), ("answer", fit.answer)):
        if lf is not None:
            out.append(
                f"\n{label} lengths: median "
                + ", ".join(f"{d} {v}" for d, v in lf.median.items())
                + f"; sigma {lf.spread:.2f}; {lf.describe()}"
            )
    if fit.unfitted:
        out.append("\nnot fitted:")
        out += [f"  {k}: {v}" for k, v in fit.unfitted.items()]
    return "\n".join(out) + "\n"
