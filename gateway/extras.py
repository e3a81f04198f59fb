"""SGLang request fields that reach past the request that carries them, refused unless allowed.

SGLang takes extra fields beside OpenAI's, and the gateway passes them through untouched, with a
few exceptions a client must not set on a shared fleet (`gateway.allowed_extras` lets an operator
who needs one through):

- `custom_logit_processor`: code, dill-serialised, that a server started with
  `--enable-custom-logit-processor` deserialises and runs (`sampling/custom_logit_processor.py`);
- `return_hidden_states`: the model's hidden states, megabytes per token, from servers started
  with `--enable-return-hidden-states`;
- `bootstrap_host`, `bootstrap_port`, `bootstrap_room`, `bootstrap_pair_key`: where a prefill-decode
  disaggregated server fetches or sends its KV cache (a client could point it elsewhere);
- `rid`: the server's own request id, the handle of `/abort_request` and of its logs, which one
  client could set to another's;
- `data_parallel_rank`: pins the request to one data-parallel rank, past the server's balancing.
"""

from __future__ import annotations

from collections.abc import Collection

from gateway.errors import ApiError

__all__ = ["GUARDED_EXTRAS", "check_extras", "guarded_extra"]

GUARDED_EXTRAS = ("custom_logit_processor", "return_hidden_states", "bootstrap_*", "rid", "data_parallel_rank")
_EXACT = frozenset(n for n in GUARDED_EXTRAS if not n.endswith("*"))
_PREFIXES = tuple(n[:-1] for n in GUARDED_EXTRAS if n.endswith("*"))


def guarded_extra(name: str) -> bool:
    """`name` is a field the gateway refuses unless allowed (a `bootstrap_*` name, or `bootstrap_*` itself)."""
    return name in _EXACT or name.startswith(_PREFIXES) or name in GUARDED_EXTRAS


def check_extras(fields: Collection[str], allowed: Collection[str]) -> None:
    """The 400 for the first guarded field among a body's `fields` that `allowed` does not name."""
    if _EXACT.isdisjoint(fields) and not any(name.startswith(_PREFIXES) for name in fields):
        return  # the common case: none at all
    for name in fields:
        if (name in _EXACT or name.startswith(_PREFIXES)) and name not in allowed:
            if name.startswith(_PREFIXES) and "bootstrap_*" in allowed:
                continue
            raise ApiError(
                400,
                f"'{name}' is not accepted by this gateway: it reaches past this request on a shared "
                "server (an operator can allow it: gateway.allowed_extras)",
                param=name,
                code="field_not_allowed",
            )
