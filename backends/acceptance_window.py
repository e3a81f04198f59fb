"""A windowed acceptance length from what a real SGLang server reports, for drift detection.

A router watching a drafter degrade needs acceptance over the last moments, not since start: on a
server up for a day, an hour of collapsed acceptance moves the lifetime average by a few percent.
SGLang 0.5.23 reports (sources under `python/sglang/srt/`):

1. `/metrics` gauge `sglang:spec_accept_length` (only with `--enable-metrics`): accepted tokens per
   verify pass over the last `decode_log_interval` (40) decode steps
   (`managers/scheduler_components/metrics_reporter.py`). Windowed already: used as it is.
2. `/v1/loads` `decode_moments` (core keys, no flag needed): cumulative sums since start, among them
   the sum of batch sizes over decode steps (one verify pass per request and step under speculation,
   the weight SGLang's own lifetime average divides by) and the tokens those steps generated
   (accepted drafts plus the bonus token: `managers/utils.py::get_num_generated_tokens`). Their ratio
   is a lifetime average kept fresh every step; the difference of two polls, weighted by the verify
   passes between them, is the acceptance over that window:

       window = (A2 * W2 - A1 * W1) / (W2 - W1) = (G2 - G1) / (W2 - W1),   A = G / W

   The scheduler leaves out steps after an idle gap and steps over 2 s (`scheduler.py`,
   `STEP_MAX_US`) from both sums alike. `speculative.accept_length` is the same kind of lifetime
   average but refreshed only every 40 steps, so the moments are the better pair to difference.
3. Neither (an older 0.5.x, or a server without decode moments): no windowed figure. Differencing
   `speculative.accept_length` needs the lifetime verify count it divides by; SGLang publishes it
   nowhere else without metrics, and the gateway's own count of verify passes on a backend is only
   its own traffic, from which the per-request telemetry the policy already learns from says more.
   So the policy is left with per-request telemetry alone, never the diluted lifetime figure.

A window closes once it holds `MIN_VERIFY_PASSES` passes (SGLang's gauge closes every 40 decode
steps); an idle backend keeps its last window, as the gauge keeps its last value.
"""

from __future__ import annotations

from backends.loads import LoadReport

MIN_VERIFY_PASSES = 40  # like the gauge's 40-step interval: enough passes that one window is not noise
_BATCH, _GENERATED = 1, 5  # indexes into decode_moments


class AcceptanceWindow:
    """One backend's windowed acceptance, updated at each poll."""

    __slots__ = ("value", "source", "_start")

    def __init__(self) -> None:
        self.value: float | None = None
        self.source: str | None = None
        self._start: tuple[float, float] | None = None  # (verify passes, generated tokens) at the window's start

    def update(self, report: LoadReport, gauge: float | None = None) -> float | None:
        """Feed one poll: the /v1/loads report and, when the server has metrics on, the gauge."""
        if gauge is not None and gauge > 0:
            self.value, self.source = gauge, "metrics gauge"
            return self.value
        moments = report.decode_moments
        if moments is None:
            if report.accept_length is not None:  # a /metrics-only server: its gauge, from the load report
                self.value, self.source = report.accept_length, report.accept_source
            return self.value
        now = (moments[_BATCH], moments[_GENERATED])
        start = self._start
        if start is None or now[0] < start[0]:  # the first poll, or the server restarted
            self._start = now
            return self.value
        passes = now[0] - start[0]
        if passes >= MIN_VERIFY_PASSES:
            self.value, self.source = (now[1] - start[1]) / passes, "decode moments"
            self._start = now
        return self.value
