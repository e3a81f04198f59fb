"""Which gateway strategy an SGLang server runs, from the `speculative_algorithm` it reports.

SGLang 0.5.23 resolves `--speculative-algorithm` before `/server_info` publishes it
(`srt/arg_groups/speculative_hook.py`: upper-cased; NEXTN becomes EAGLE; NEXTN or EAGLE with a
Gemma4 assistant draft becomes FROZEN_KV_MTP), so a server reports one of the names of
`srt/speculative/spec_info.py: SpeculativeAlgorithm` (DFLASH, UNO, DSPARK, EAGLE, EAGLE3,
FROZEN_KV_MTP, STANDALONE, NGRAM; null without speculation), a name a plugin registered
(`SpeculativeAlgorithm.register`), or, on a build of pull request #29907, DDTREE. Older 0.5.x
releases report the name as given (NEXTN, MTP in some builds).

The gateway knows five strategies (`backends.Strategy`); a strategy only chooses the prior the
gateway starts from (`policies/priors.py`): acceptance, step time and prefill are learned from
the server's own answers and its start-up measurement. So each algorithm maps to the strategy
whose drafter works the same way, and an algorithm with no such strategy is not guessed.
"""

from __future__ import annotations

import msgspec

from backends import Strategy

__all__ = ["Classification", "classify", "verify_width"]


class Classification(msgspec.Struct, frozen=True, kw_only=True):
    """What a reported algorithm means here. `strategy` None: not classified, `why` says why."""

    reported: str | None  # as the server reported it (None: no speculation)
    strategy: str | None
    why: str
    twin_algorithm: str | None = None  # the twin's drafting law that models it (profile speculative.algorithm)


# reported name -> (strategy, twin algorithm, why)
_KNOWN: dict[str, tuple[str, str, str]] = {
    "EAGLE3": ("eagle3", "EAGLE3", "EAGLE-3 drafter"),
    "EAGLE": (
        "eagle3",
        "EAGLE3",
        "EAGLE/MTP drafter (SGLang resolves NEXTN to EAGLE): a chain or tree from the target's hidden states, "
        "as EAGLE-3's",
    ),
    "NEXTN": ("eagle3", "EAGLE3", "NEXTN (MTP) drafter, reported unresolved by an older SGLang: EAGLE's worker"),
    "MTP": ("eagle3", "EAGLE3", "MTP drafter (an older build's name for NEXTN): EAGLE's worker"),
    "FROZEN_KV_MTP": (
        "eagle3",
        "EAGLE3",
        "Gemma4 assistant MTP draft (SGLang promotes NEXTN/EAGLE to it): an EAGLE-family drafter",
    ),
    "STANDALONE": (
        "eagle3",
        "EAGLE3",
        "a separate small draft model run by EAGLE's v2 worker (num_steps chained drafts): the EAGLE-3 prior is "
        "the nearest start",
    ),
    "UNO": (
        "eagle3",
        "EAGLE3",
        "UNO's LoRA drafter proposes a tree verified as EAGLE's (`uno_worker_v2.py`): the EAGLE-3 prior is the "
        "nearest start",
    ),
    "DFLASH": ("dflash", "DFLASH", "DFlash block drafter"),
    "DSPARK": ("dflash", "DFLASH", "DSpark, of the DFlash family (`is_dflash_family`): a block drafter"),
    "DDTREE": ("ddtree", "DDTREE", "DDTree (SGLang pull request #29907): a tree over a DFlash drafter"),
    "NGRAM": ("ngram", "NGRAM", "n-gram drafts from a trie of the server's own output"),
}


def classify(reported: object) -> Classification:
    """The strategy of a server reporting `speculative_algorithm = reported`."""
    if reported is None or (isinstance(reported, str) and reported.strip().upper() in ("", "NONE")):
        return Classification(reported=None, strategy="ar", why="no speculative decoding")
    if not isinstance(reported, str):
        return Classification(
            reported=str(reported), strategy=None, why=f"speculative_algorithm is not a name: {reported!r}"
        )
    name = reported.strip().upper()
    known = _KNOWN.get(name)
    if known is None:
        return Classification(
            reported=reported,
            strategy=None,
            why=f"{reported!r} is not an algorithm SGLang 0.5.23 builds in (a plugin's?): no strategy of the gateway "
            "drafts the same way; set `strategy` by hand to the nearest one",
        )
    strategy, twin_algorithm, why = known
    if strategy not in {s.value for s in Strategy}:
        return Classification(
            reported=reported,
            strategy=None,
            why=f"{why}; this gateway has no {strategy!r} strategy yet",
            twin_algorithm=twin_algorithm,
        )
    return Classification(reported=reported, strategy=strategy, why=why, twin_algorithm=twin_algorithm)


def _int(info: dict[str, object], key: str) -> int | None:
    value = info.get(key)
    return value if type(value) is int and value > 0 else None


def verify_width(info: dict[str, object]) -> int | None:
    """Tokens each running sequence verifies per step (1 without speculation; None: not reported)."""
    c = classify(info.get("speculative_algorithm"))
    if c.reported is None:
        return 1
    name = c.reported.strip().upper()
    if name == "DDTREE" and (budget := _int(info, "speculative_ddtree_budget")) is not None:
        return budget + 1
    if name == "DFLASH" and (block := _int(info, "speculative_dflash_block_size")) is not None:
        return block
    return _int(info, "speculative_num_draft_tokens")
