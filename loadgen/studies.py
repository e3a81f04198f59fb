"""The named studies of `loadgen study` and their reference figures (`docs/studies.md`).

Data only: what each study runs (targets, datasets, concurrency levels, prompts per level) and
which measured figure is compared with which reference. The figures keep their provenance ids
R1-R8 of docs/studies.md; `key` tells apart two figures of one row (R5's tok/s and its step time).
Running a study is `study.py`; comparing is `checks.py`.

Figures are in the units of the real hardware (simulated time for twins): tok/s, s, ms, or
tokens per verify step (accept length, which does not depend on time).
"""

from __future__ import annotations

import math

import msgspec


class Reference(msgspec.Struct, frozen=True, kw_only=True):
    """One reference figure. `value` for a number, `low`/`high` for a range."""

    key: str  # unique: "R1", "R5-step", ...
    id: str  # provenance id of docs/studies.md: R1..R8
    system: str
    load: str
    figure: str  # as docs/studies.md states it
    provenance: str
    unit: str = ""
    value: float | None = None
    low: float | None = None
    high: float | None = None

    @property
    def text(self) -> str:
        if self.value is not None:
            return f"{self.value:g}"
        return f"{self.low:g}-{self.high:g}"


REFERENCES: dict[str, Reference] = {
    r.key: r
    for r in (
        Reference(
            key="R1",
            id="R1",
            system="K2.6 autoregressive, TP8",
            load="C=1",
            figure="26.3 tok/s per request (per-prompt range 25.6-26.5)",
            provenance="study, measured",
            unit="tok/s",
            value=26.3,
        ),
        Reference(
            key="R2",
            id="R2",
            system="K2.6 autoregressive, TP8",
            load="C=32",
            figure="807.5 tok/s aggregate",
            provenance="study, measured",
            unit="tok/s",
            value=807.5,
        ),
        Reference(
            key="R3",
            id="R3",
            system="K2.6 autoregressive, TP8",
            load="C=1..32",
            figure="wall time per batch about 19.6 s at every level",
            provenance="study, measured",
            unit="s",
            value=19.6,
        ),
        Reference(
            key="R4",
            id="R4",
            system="Qwen3.6-27B autoregressive, TP1",
            load="C=1",
            figure="about 26 tok/s",
            provenance="study, measured",
            unit="tok/s",
            value=26.0,
        ),
        Reference(
            key="R5",
            id="R5",
            system="Qwen3.6-27B DDTree budget 15",
            load="C=1",
            figure="173 tok/s",
            provenance="study, measured",
            unit="tok/s",
            value=173.0,
        ),
        Reference(
            key="R5-step",
            id="R5",
            system="Qwen3.6-27B DDTree budget 15",
            load="C=1",
            figure="step time about 87 ms",
            provenance="study, measured",
            unit="ms",
            value=87.0,
        ),
        Reference(
            key="R5-accept",
            id="R5",
            system="Qwen3.6-27B DDTree budget 15",
            load="C=1",
            figure="173 x 0.087 = about 15 tokens per verify step",
            provenance="derived in docs/studies.md from R5 (arithmetic, not a measurement)",
            unit="tok/step",
            value=round(173 * 0.087, 2),
        ),
        Reference(
            key="R6",
            id="R6",
            system="Qwen3.6-27B DDTree budget 64",
            load="C=1",
            figure="64 tok/s",
            provenance="study, measured",
            unit="tok/s",
            value=64.0,
        ),
        Reference(
            key="R6-step",
            id="R6",
            system="Qwen3.6-27B DDTree budget 64",
            load="C=1",
            figure="step time about 77 ms",
            provenance="study, measured",
            unit="ms",
            value=77.0,
        ),
        Reference(
            key="R6-accept",
            id="R6",
            system="Qwen3.6-27B DDTree budget 64",
            load="C=1",
            figure="64 x 0.077 = about 4.9 tokens per verify step",
            provenance="derived in docs/studies.md from R6 (arithmetic, not a measurement)",
            unit="tok/step",
            value=round(64 * 0.077, 2),
        ),
        Reference(
            key="R7",
            id="R7",
            system="K2.6 DFlash (block 8)",
            load="C=32, GSM8K",
            figure="2577 tok/s aggregate",
            provenance="drafter's official benchmark; its hardware is not the study's",
            unit="tok/s",
            value=2577.0,
        ),
        Reference(
            key="R8",
            id="R8",
            system="K2.6 DFlash (block 8)",
            load="per dataset",
            figure="acceptance length 3.6 to 4.9 depending on the dataset",
            provenance="drafter's official figures",
            unit="tok/step",
            low=3.6,
            high=4.9,
        ),
        Reference(
            key="R8-order",
            id="R8",
            system="K2.6 DFlash (block 8)",
            load="per dataset",
            figure="math highest, chat lowest (math > code > chat)",
            provenance="drafter's official figures (range); order as DSpark's GSM8K vs MT-Bench (public prior)",
        ),
    )
}


class Leg(msgspec.Struct, frozen=True, kw_only=True):
    """One target through its levels with one dataset. Prompts per level: `batches` x C, at
    least `min_prompts`, rounded up to whole batches of C (the studies time whole batches)."""

    label: str  # the run's name in summary.json and the plots
    target: str  # a target of the study (twin profile name, or "gateway")
    dataset: str
    concurrency: tuple[int, ...]
    max_tokens: int = 512
    batches: int = 1
    min_prompts: int = 1
    quick_concurrency: tuple[int, ...] | None = None  # None: as `concurrency`
    quick_batches: int | None = None
    quick_min_prompts: int | None = None

    def levels(self, quick: bool) -> tuple[int, ...]:
        return (self.quick_concurrency or self.concurrency) if quick else self.concurrency

    def num_prompts(self, concurrency: int, quick: bool) -> int:
        batches = (self.quick_batches or self.batches) if quick else self.batches
        least = (self.quick_min_prompts or self.min_prompts) if quick else self.min_prompts
        n = max(batches * concurrency, least)
        return math.ceil(n / concurrency) * concurrency


class Check(msgspec.Struct, frozen=True, kw_only=True):
    """Measured figure vs reference. `metric` is a Level field of summary.json or a derived
    figure of checks.DERIVED. `legs` is used by order checks only (descending `metric`)."""

    ref: str  # key of REFERENCES
    what: str
    leg: str = ""
    concurrency: int = 0
    metric: str = ""
    legs: tuple[str, ...] = ()


class Study(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    title: str
    targets: tuple[str, ...]  # twin profiles, plus "gateway" (a gateway over the other targets)
    legs: tuple[Leg, ...]
    checks: tuple[Check, ...]
    # Compare the gateway with the best single backend at every level (k26-strategies).
    gateway_vs_best: bool = False


SWEEP = (1, 2, 4, 8, 16, 32)

_AR_CHECKS = (
    Check(
        ref="R1",
        what="K2.6 AR C=1 per-request tok/s",
        leg="k26-ar",
        concurrency=1,
        metric="mean_request_output_throughput",
    ),
    Check(ref="R2", what="K2.6 AR C=32 aggregate tok/s", leg="k26-ar", concurrency=32, metric="output_throughput"),
    *(
        Check(
            ref="R3", what=f"K2.6 AR wall time per batch C={c}", leg="k26-ar", concurrency=c, metric="wall_per_batch_s"
        )
        for c in SWEEP
    ),
)

_DFLASH_DATASETS = ("math", "code", "chat")

STUDIES: dict[str, Study] = {
    s.name: s
    for s in (
        Study(
            name="k26-ar-sweep",
            title="K2.6 autoregressive, C=1..32, ~512-token outputs, one batch per level (R1-R3)",
            targets=("k26-ar",),
            legs=(Leg(label="k26-ar", target="k26-ar", dataset="mixed", concurrency=SWEEP),),
            checks=_AR_CHECKS,
        ),
        Study(
            name="qwen36-ddtree-budgets",
            title="Qwen3.6-27B at C=1: autoregressive vs DDTree budget 15 vs 64 (R4-R6)",
            targets=("qwen36-ar", "qwen36-ddtree-b15", "qwen36-ddtree-b64"),
            legs=(
                # The study's prompts are treated as math-like (the twin's calibration does the same).
                Leg(
                    label="qwen36-ar", target="qwen36-ar", dataset="math", concurrency=(1,), batches=2, quick_batches=1
                ),
                Leg(
                    label="qwen36-ddtree-b15",
                    target="qwen36-ddtree-b15",
                    dataset="math",
                    concurrency=(1,),
                    batches=8,
                    quick_batches=4,
                ),
                Leg(
                    label="qwen36-ddtree-b64",
                    target="qwen36-ddtree-b64",
                    dataset="math",
                    concurrency=(1,),
                    batches=8,
                    quick_batches=4,
                ),
            ),
            checks=(
                Check(
                    ref="R4",
                    what="Qwen3.6 AR C=1 per-request tok/s",
                    leg="qwen36-ar",
                    concurrency=1,
                    metric="mean_request_output_throughput",
                ),
                Check(
                    ref="R5",
                    what="Qwen3.6 DDTree b15 C=1 per-request tok/s",
                    leg="qwen36-ddtree-b15",
                    concurrency=1,
                    metric="mean_request_output_throughput",
                ),
                Check(
                    ref="R5-step",
                    what="Qwen3.6 DDTree b15 C=1 step time",
                    leg="qwen36-ddtree-b15",
                    concurrency=1,
                    metric="step_ms",
                ),
                Check(
                    ref="R5-accept",
                    what="Qwen3.6 DDTree b15 C=1 tokens per step",
                    leg="qwen36-ddtree-b15",
                    concurrency=1,
                    metric="accept_length",
                ),
                Check(
                    ref="R6",
                    what="Qwen3.6 DDTree b64 C=1 per-request tok/s",
                    leg="qwen36-ddtree-b64",
                    concurrency=1,
                    metric="mean_request_output_throughput",
                ),
                Check(
                    ref="R6-step",
                    what="Qwen3.6 DDTree b64 C=1 step time",
                    leg="qwen36-ddtree-b64",
                    concurrency=1,
                    metric="step_ms",
                ),
                Check(
                    ref="R6-accept",
                    what="Qwen3.6 DDTree b64 C=1 tokens per step",
                    leg="qwen36-ddtree-b64",
                    concurrency=1,
                    metric="accept_length",
                ),
            ),
        ),
        Study(
            name="k26-dflash-c32",
            title="K2.6 DFlash block 8 at C=32: GSM8K-like aggregate (R7), acceptance per dataset (R8)",
            targets=("k26-dflash",),
            legs=tuple(
                Leg(
                    label=f"k26-dflash/{d}",
                    target="k26-dflash",
                    dataset=d,
                    concurrency=(32,),
                    batches=4 if d == "math" else 2,
                    quick_batches=2 if d == "math" else 1,
                )
                for d in _DFLASH_DATASETS
            ),
            checks=(
                Check(
                    ref="R7",
                    what="K2.6 DFlash C=32 GSM8K-like aggregate tok/s",
                    leg="k26-dflash/math",
                    concurrency=32,
                    metric="output_throughput",
                ),
                *(
                    Check(
                        ref="R8",
                        what=f"K2.6 DFlash acceptance length, {d}",
                        leg=f"k26-dflash/{d}",
                        concurrency=32,
                        metric="accept_length",
                    )
                    for d in _DFLASH_DATASETS
                ),
                Check(
                    ref="R8-order",
                    what="K2.6 DFlash acceptance order math > code > chat",
                    concurrency=32,
                    metric="accept_length",
                    legs=tuple(f"k26-dflash/{d}" for d in _DFLASH_DATASETS),
                ),
            ),
        ),
        Study(
            name="k26-strategies",
            title="K2.6: autoregressive, EAGLE-3, DFlash, DDTree and the gateway over them, C=1..32, mixed prompts",
            targets=("k26-ar", "k26-eagle3", "k26-dflash", "k26-ddtree", "gateway"),
            legs=tuple(
                Leg(
                    label=t,
                    target=t,
                    dataset="mixed",
                    concurrency=SWEEP,
                    batches=2,
                    min_prompts=6,
                    quick_concurrency=(1, 8, 32),
                    quick_batches=1,
                    quick_min_prompts=3,
                )
                for t in ("k26-ar", "k26-eagle3", "k26-dflash", "k26-ddtree", "gateway")
            ),
            checks=_AR_CHECKS,
            gateway_vs_best=True,
        ),
    )
}
