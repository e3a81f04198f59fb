"""Bring your own SGLang servers: read them (`discover`), name their strategy (`algorithms`), and
fit a twin profile from a measurement sweep of a live server (`specroute profile`, `cli`)."""
