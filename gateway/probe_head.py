"""HEAD on the probe and scrape routes, answered as their GET is, without the body.

Uptime monitors and some load balancers check a URL with HEAD. Litestar routes a `@get` handler
for GET only, so they got 405. RFC 9110 §9.3.2: HEAD is GET without the content, with the headers
GET would send (`content-length` included). Here the GET is run and its body dropped; the server
(uvicorn) sends no body after a HEAD either way.
"""

from __future__ import annotations

from gateway.asgi import ASGIApp, Message, Receive, Scope, Send, routed_path

__all__ = ["HEAD_PATHS", "ProbeHead"]

HEAD_PATHS = frozenset({"/health", "/ready", "/metrics", "/v1/models", "/server_info"})


class ProbeHead:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD" or routed_path(scope) not in HEAD_PATHS:
            return await self.app(scope, receive, send)

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)
