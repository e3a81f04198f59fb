"""Everything about one upstream SGLang server: descriptors, the HTTP client, the twin (`backends.sim`)."""

from backends.descriptor import BackendSpec, Strategy

__all__ = ["BackendSpec", "Strategy"]
