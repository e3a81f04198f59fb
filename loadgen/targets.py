"""Turning `--target` words into URLs and models, over HTTP only.

`gateway` is the gateway URL; a backend name is looked up in the gateway's
`GET /admin/backends`; anything starting with http:// or https:// is used as is. The model is
`--model` if given, else the backend's `model`, else the first id of `GET {url}/v1/models`.
That last request doubles as the preflight: an unreachable target, a wrong API key or a server
that is not OpenAI-compatible fails here with one line, before any load is sent.
"""

from __future__ import annotations

import os

import aiohttp
import msgspec

from common.json_errors import JSON_DECODE_ERRORS
from loadgen.client import Target, error_message


class TargetError(Exception):
    """A target cannot be used; the message is one line for the user."""


class _BackendEntry(msgspec.Struct):
    name: str
    url: str
    model: str | None = None
    strategy: str | None = None


class _Backends(msgspec.Struct):
    backends: list[_BackendEntry]


class _ModelEntry(msgspec.Struct):
    id: str


class _Models(msgspec.Struct):
    data: list[_ModelEntry]


async def _get(session: aiohttp.ClientSession, url: str, what: str, api_key: str | None) -> bytes:
    hdrs = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with session.get(url, headers=hdrs, timeout=aiohttp.ClientTimeout(total=15)) as resp:
            body = await resp.read()
            if resp.status in (401, 403):
                raise TargetError(
                    f"{what}: HTTP {resp.status} from {url} (wrong or missing --api-key?): {error_message(body)}"
                )
            if resp.status != 200:
                raise TargetError(f"{what}: HTTP {resp.status} from {url}: {error_message(body)}")
            return body
    except aiohttp.ClientConnectorError as e:
        reason = e.os_error.strerror if e.os_error and e.os_error.strerror else str(e)
        raise TargetError(f"{what}: cannot connect to {url} ({reason})") from None
    except (TimeoutError, aiohttp.ClientError) as e:
        raise TargetError(f"{what}: request to {url} failed ({type(e).__name__}: {e})") from None


async def resolve(
    session: aiohttp.ClientSession, word: str, *, gateway_url: str, model: str | None, api_key: str | None
) -> Target:
    """Resolve one `--target` word; raise TargetError with a one-line reason."""
    backend_model = None
    if word == "gateway":
        url = gateway_url
    elif word.startswith(("http://", "https://")):
        url = word
    else:
        # the gateway's admin API answers its admin key only (or nothing, in local development)
        admin_key = os.environ.get("SPECROUTE_ADMIN_KEY") or api_key
        body = await _get(session, gateway_url.rstrip("/") + "/admin/backends", f"target {word!r}", admin_key)
        try:
            entries = msgspec.json.decode(body, type=_Backends).backends
        except JSON_DECODE_ERRORS:
            raise TargetError(
                f'target {word!r}: {gateway_url}/admin/backends did not return {{"backends": [...]}}'
            ) from None
        match = next((b for b in entries if b.name == word), None)
        if match is None:
            names = ", ".join(b.name for b in entries) or "none"
            raise TargetError(
                f"target {word!r}: no such backend at {gateway_url} (known: {names}; or use 'gateway' or a URL)"
            )
        url, backend_model = match.url, match.model
    url = url.rstrip("/")
    models_url = url + "/v1/models"
    body = await _get(session, models_url, f"target {word!r}", api_key)
    try:
        ids = [m.id for m in msgspec.json.decode(body, type=_Models).data]
    except JSON_DECODE_ERRORS:
        raise TargetError(
            f"target {word!r}: {models_url} is not an OpenAI model list (not an OpenAI-compatible server?)"
        ) from None
    chosen = model or backend_model or (ids[0] if ids else None)
    if chosen is None:
        raise TargetError(f"target {word!r}: {models_url} lists no model; pass --model")
    return Target(label=word, url=url, model=chosen)
