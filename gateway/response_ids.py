"""Response ids are data, never paths.

A stored Response is named by its id, and the gateway puts that id into the path of the calls that
find it (`GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`). An id is the client's string:
unchecked, `resp_a/../../start_profile` would reach any route of every backend. So every id a client
gives (a `previous_response_id`, a Response's chosen `request_id`, the id in a path) must have the
shape SGLang issues, `resp_` and a UUID's hex (`protocol.py: ResponsesRequest.request_id`), loosened
only to letters, digits, `-` and `_`, at most `MAX_LENGTH` characters: a single path segment with
nothing to encode. Anything else is refused with a 400 naming the field, before any backend is asked.
"""

from __future__ import annotations

import re

from gateway.errors import ApiError, clip

__all__ = ["MAX_LENGTH", "check_response_id", "is_response_id"]

MAX_LENGTH = 128
_SHAPE = re.compile(rf"resp_[A-Za-z0-9_-]{{1,{MAX_LENGTH - len('resp_')}}}")


def is_response_id(value: object) -> bool:
    return isinstance(value, str) and _SHAPE.fullmatch(value) is not None


def check_response_id(value: object, param: str) -> str:
    """`value` when it is a response id; else the 400 that names `param`."""
    if is_response_id(value):
        assert isinstance(value, str)
        return value
    shown = clip(value) if isinstance(value, str) else type(value).__name__
    raise ApiError(
        400,
        f"Invalid '{param}': {shown}. Expected an ID that begins with 'resp' ('resp_' and at most "
        f"{MAX_LENGTH - len('resp_')} letters, digits, '-' or '_', as SGLang makes them).",
        param=param,
        code="invalid_response_id",
    )
