"""`--output DIR` as an argparse type: the directory is made (or found) when the arguments are
read, so that a path that cannot be one (an existing file, no permission) fails in one line before
a run of minutes, not with a traceback after it."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["output_dir"]


def output_dir(text: str) -> Path:
    path = Path(text)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{text!r} cannot be the output directory: {e.strerror or e}") from None
    return path
