"""Argument parsing for the `specroute` subcommands that own their parsers: a usage error is an
exception the command turns into one line and exit code 2, never argparse's own exit."""

from __future__ import annotations

import argparse
from typing import NoReturn


class UsageError(Exception):
    pass


class UsageParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)
