"""How long a client of SGLang servers keeps an idle connection: less than the server does.

SGLang's HTTP server closes a connection idle for SGLANG_TIMEOUT_KEEP_ALIVE seconds (uvicorn's
`timeout_keep_alive`, default 5: `entrypoints/http_server.py`, `environ.py`). A POST sent on a
connection the server is closing at that moment is lost: aiohttp resends only idempotent
requests. The gateway would count it against a healthy backend, and loadgen as a failed request.
"""

from __future__ import annotations

__all__ = ["CLIENT_KEEP_ALIVE_S"]

CLIENT_KEEP_ALIVE_S = 4.0
