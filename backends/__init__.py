"""Everything about one upstream SGLang server: its descriptor, the HTTP client, what it reports."""

from backends.descriptor import BackendSpec, Strategy

__all__ = ["BackendSpec", "Strategy"]
