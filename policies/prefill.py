"""Time to first token of one backend as a function of the prompt tokens it must prefill.

TTFT = (fixed part: the first forward pass, scheduling, network) + (seconds per uncached token) x
(prompt tokens the radix cache does not hold) + (seconds per causal pair) x (query-key pairs of
those tokens' attention). The pair term is attention's quadratic part: `u` new tokens after `h`
cached ones attend to `u x (h + u / 2)` positions (`causal_pairs`), so a 64k-token history costs
several times a short prompt per token, and a cached prefix saves part of it.

The fixed part and the per-token slope are learned per backend from finished requests by least
squares over recent outcomes, with exponential forgetting (weight `1 - alpha` per new sample) and
the prior as two pseudo-observations, at 0 tokens and at `_PRIOR_X` tokens: while every request is
short, the slope stays the prior's; long uncached prompts move it.

Only requests dispatched to an idle backend (none of ours in flight there) are learned from: on a
busy one a TTFT is mostly waiting, for a slot or behind other prompts' prefills (SGLang prefills
first come, first served, one chunked prompt at a time), which the cost model predicts from the
backend's state (`BackendView.pending_prefill`, the load) and which, learned as a constant of the
backend, would make whichever server last took a long document look seconds slower than its twin.

When the server reports its prefill counters (`policies.server_counters`), each window gives its
busy seconds per computed token `r` and, from the gateway's own counts over the same window, the
causal pairs `q` and the prompts `m` per token of what was prefilled. Over recent windows
`r = a + c q + b m` is fitted (ridge on `c` and `b` toward their priors, so that windows of alike
prompts leave them there): `a` is the per-token slope, `c` the pair cost and `b` each prefill
pass's own forward, fitted so that it does not read as dearer tokens in windows of short prompts
(the cost model does not price it: its TTFT formula has that pass). TTFT then only teaches the
fixed part.
"""

from __future__ import annotations

import math

__all__ = ["PrefillModel", "causal_pairs"]

_PRIOR_X = 4096.0  # tokens: where the prior's second pseudo-point sits
_PRIOR_WEIGHT = 2.0
_MAX_TTFT_S = 600.0
_RATE_KEEP = 0.9  # weight a server window keeps per newer one: about the last ten count
# Ridge priors of the window fit, each as much as one window whose prompts differ from the others'
# by the spread given: windows that differ more decide the coefficient, alike ones leave it.
_PAIR_SPREAD = 4096.0  # pairs per token: a mix of short turns and 8k-token histories
_FIXED_SPREAD = 1 / 2048  # prompts per token: 2k-token prompts against long ones


def causal_pairs(prompt_tokens: int, uncached: int) -> float:
    """Causal (query, key) pairs of prefilling the last `uncached` of `prompt_tokens` tokens."""
    if uncached <= 0:
        return 0.0
    if uncached > prompt_tokens:
        uncached = prompt_tokens
    return uncached * (prompt_tokens - uncached + uncached / 2)


class PrefillModel:
    """Predicted seconds from dispatch to first token, for `uncached` prompt tokens."""

    __slots__ = (
        "base_s",
        "per_token_s",
        "pair_s",
        "fixed_s",
        "samples",
        "server_rate",
        "_alpha",
        "_prior",
        "_prior_pair_s",
        "_prior_fixed_s",
        "_data",
        "_sized",
        "_xx",
        "_xr",
    )

    def __init__(self, base_s: float, per_token_s: float, pair_s: float = 0.0, alpha: float = 0.05) -> None:
        if not (0 < alpha < 1):
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        self._alpha = alpha
        self._prior_pair_s = pair_s  # what a later reset without one keeps
        self.reset(base_s, per_token_s, pair_s)

    def reset(self, base_s: float, per_token_s: float, pair_s: float | None = None) -> None:
        """Start over from a new prior (a measurement at startup replaces the strategy's guess;
        `pair_s` None keeps the pair cost's prior, which a short measurement cannot see)."""
        if pair_s is None:
            pair_s = self._prior_pair_s
        if not (base_s >= 0 and per_token_s >= 0 and pair_s >= 0 and math.isfinite(base_s + per_token_s + pair_s)):
            raise ValueError(f"prefill prior must be finite and >= 0, got {base_s}, {per_token_s}, {pair_s}")
        self.base_s, self.per_token_s, self.pair_s = base_s, per_token_s, pair_s
        self._prior_pair_s = pair_s
        # Sums (w, x, y, xx, xy) of two points, (0, base) and (_PRIOR_X, base + slope x _PRIOR_X),
        # weight _PRIOR_WEIGHT / 2 each. They do not decay: without long prompts in the data they
        # keep the slope where it was, whatever the number of short ones.
        w = _PRIOR_WEIGHT / 2
        y1 = base_s + per_token_s * _PRIOR_X
        self._prior = (2 * w, w * _PRIOR_X, w * (base_s + y1), w * _PRIOR_X * _PRIOR_X, w * _PRIOR_X * y1)
        self._prior_fixed_s = self.fixed_s = base_s  # a prefill pass's fixed part, as an idle one's
        self._data = (0.0, 0.0, 0.0, 0.0, 0.0)
        self._xx = [[0.0] * 3 for _ in range(3)]  # window fit's weighted sums (x x^T, x r)
        self._xr = [0.0] * 3
        self.samples = 0
        self.server_rate = 0  # windows of the server's own prefill counters seen
        self._sized = 0  # of which the gateway's counts gave the prompts' length

    def observe_rate(
        self, per_token_s: float, pairs_per_token: float | None = None, prompts_per_token: float | None = None
    ) -> None:
        """The server measured `per_token_s` busy seconds per computed prompt token over a window
        in which the prompts it computed averaged `pairs_per_token` causal pairs per token, and
        numbered `prompts_per_token` per token (None: not known). Fits the window's rate as
        `per_token_s + pair_s x pairs + fixed_s x prompts`: each prefill pass has a fixed part
        too (a forward of its own), which would otherwise read as a dearer token in the windows of
        short prompts. Once the gateway's counts have told the length of some window, one they
        cannot tell (a prompt of its own was part-way at each report) is left out: its prompts are
        the long ones, and the mean length would price their time as dearer tokens."""
        if not (math.isfinite(per_token_s) and 0 < per_token_s < 1.0):
            return
        if (
            pairs_per_token is None
            or prompts_per_token is None
            or not math.isfinite(pairs_per_token + prompts_per_token)
            or pairs_per_token < 0
            or prompts_per_token < 0
        ):
            if self._sized:
                return
            # the gateway counts nothing here: one cost per token, as the windows measure it
            self.server_rate += 1
            a = max(1.0 - _RATE_KEEP, 1.0 / self.server_rate)
            self.per_token_s += a * (per_token_s - self.per_token_s)
            self._fit()
            return
        self._sized += 1
        self.server_rate += 1
        # in units of the priors' spreads, so that the system is well scaled
        x = (1.0, pairs_per_token / _PAIR_SPREAD, prompts_per_token / _FIXED_SPREAD)
        keep = _RATE_KEEP
        xx, xr = self._xx, self._xr
        for i in range(3):
            xr[i] = xr[i] * keep + x[i] * per_token_s
            for j in range(3):
                xx[i][j] = xx[i][j] * keep + x[i] * x[j]
        # ridge toward the priors of the pair and fixed costs, one window's weight each (the
        # per-token slope is free)
        prior = (0.0, self._prior_pair_s * _PAIR_SPREAD, self._prior_fixed_s * _FIXED_SPREAD)
        a, c, b = _nonnegative_solve(
            [[xx[i][j] + (1.0 if i == j and i else 0.0) for j in range(3)] for i in range(3)],
            [xr[i] + prior[i] for i in range(3)],
        )
        c, b = c / _PAIR_SPREAD, b / _FIXED_SPREAD
        self.per_token_s, self.pair_s, self.fixed_s = a, c, b
        self._fit()

    def observe(self, ttft_s: float, uncached: int, pairs: float = 0.0) -> bool:
        """One request prefilling `uncached` tokens, `pairs` causal pairs (and not queueing),
        saw `ttft_s`."""
        if not (
            isinstance(ttft_s, (int, float)) and math.isfinite(ttft_s) and 0 < ttft_s <= _MAX_TTFT_S and uncached >= 0
        ):
            return False
        keep = 1.0 - self._alpha
        # the pair cost is the server windows' (or the prior's): TTFT fits what is left
        x, y = float(uncached), float(ttft_s) - self.pair_s * pairs
        dw, dx, dy, dxx, dxy = self._data
        self._data = (dw * keep + 1.0, dx * keep + x, dy * keep + y, dxx * keep + x * x, dxy * keep + x * y)
        self.samples += 1
        self._fit()
        return True

    def _fit(self) -> None:
        w, sx, sy, sxx, sxy = (a + b for a, b in zip(self._prior, self._data, strict=True))
        var = w * sxx - sx * sx
        if not self.server_rate and var > 1e-12 * w * w:
            slope = (w * sxy - sx * sy) / var
            self.per_token_s = slope if slope > 0 else 0.0
        self.base_s = max((sy - self.per_token_s * sx) / w, 0.0)

    def stall_s(self, uncached: int, pairs: float = 0.0) -> float:
        """Seconds the prefill's own tokens and pairs take (no fixed part)."""
        return self.per_token_s * uncached + self.pair_s * pairs

    def describe(self) -> dict[str, float | int]:
        return {
            "prefill_base_ms": round(self.base_s * 1000, 2),
            "prefill_ms_per_1k_tokens": round(self.per_token_s * 1e6, 2),
            "prefill_ms_per_mpair": round(self.pair_s * 1e9, 3),
            "prefill_pass_fixed_ms": round(self.fixed_s * 1000, 2),
            "prefill_samples": self.samples,
            "prefill_server_windows": self.server_rate,
        }


def _nonnegative_solve(m: list[list[float]], v: list[float]) -> tuple[float, float, float]:
    """The solution of the 3x3 system `m x = v` with every coordinate >= 0: a coordinate the free
    solution makes negative is set to 0 and the others solved again (at most three rounds)."""
    free = [True, True, True]
    x = [0.0, 0.0, 0.0]
    for _ in range(3):
        idx = [i for i in range(3) if free[i]]
        sub = [[m[i][j] for j in idx] + [v[i]] for i in idx]
        sol = _gauss(sub)
        if sol is None:
            break
        x = [0.0, 0.0, 0.0]
        for k, i in enumerate(idx):
            x[i] = sol[k]
        negative = [i for i in idx if x[i] < 0]
        if not negative:
            break
        free[min(negative, key=lambda i: x[i])] = False
    return max(x[0], 0.0), max(x[1], 0.0), max(x[2], 0.0)


def _gauss(a: list[list[float]]) -> list[float] | None:
    """Gaussian elimination with partial pivoting on an augmented n x (n + 1) matrix."""
    n = len(a)
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for k in range(col, n + 1):
                a[r][k] -= f * a[col][k]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (a[r][n] - sum(a[r][k] * out[k] for k in range(r + 1, n))) / a[r][r]
    return out
