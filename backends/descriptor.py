"""What the gateway knows about one upstream SGLang server, independent of how it talks to it."""

from __future__ import annotations

import enum

import msgspec


class Strategy(str, enum.Enum):  # noqa: UP042  (StrEnum would change str() and f-strings of members)
    """Decoding strategy a backend runs. `ar` is plain autoregressive decoding (no speculation)."""

    AR = "ar"
    EAGLE3 = "eagle3"
    DFLASH = "dflash"
    DDTREE = "ddtree"
    NGRAM = "ngram"  # SGLang's NGRAM: drafts from a trie of the server's own recent output

    @property
    def speculative(self) -> bool:
        return self is not Strategy.AR


class BackendSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A configured upstream: where it is, which served model it answers for, how it decodes."""

    name: str
    url: str
    model: str
    strategy: Strategy = Strategy.AR
    # The name the upstream itself serves (SGLang's --served-model-name); defaults to `model`.
    served_name: str | None = None
    api_key: str | None = None

    @property
    def upstream_model(self) -> str:
        return self.served_name or self.model
