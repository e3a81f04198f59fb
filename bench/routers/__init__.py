"""`make bench-routers`: specroute side by side with SGLang's router and LiteLLM on the same twins.

See `bench/routers/run.py`; the peers live in their own virtualenvs (`bench/routers/peers.py`),
never in specroute's dependencies.
"""
