"""Argument parsing for the `specroute` subcommands that own their parsers: a usage error is an
exception the command turns into one line and exit code 2, never argparse's own exit."""

from __future__ import annotations

import argparse
import os
from typing import NoReturn


class UsageError(Exception):
    pass


class UsageParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def api_key_from_env(var: str | None, flag: str = "--api-key-env") -> str | None:
    """The key in environment variable `var` (None: no variable named); UsageError when it is unset,
    so a key is never taken from a command line, where other users of the machine can read it."""
    if var is None:
        return None
    key = os.environ.get(var)
    if not key:
        raise UsageError(f"{flag} {var}: the variable is not set")
    return key
