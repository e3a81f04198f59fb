"""The exceptions msgspec's JSON decoders raise on bad input.

msgspec before 0.23 raises `UnicodeDecodeError` for a string that is not valid UTF-8 instead of
`msgspec.DecodeError`; catching only the latter would turn such a body into a 500 on those versions.
A document nested deeper than the interpreter's recursion limit (about a thousand levels: `[[[...]]]`)
raises `RecursionError` from msgspec and the standard library alike: bad input too, not a crash.
"""

import msgspec

JSON_DECODE_ERRORS: tuple[type[Exception], ...] = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
