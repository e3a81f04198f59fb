"""The installed package's version, one answer for every command's `--version`."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["PACKAGE", "package_version"]

PACKAGE = "specroute"


def package_version() -> str:
    """specroute's version as installed (pyproject's `version`); "unknown" when the code runs from a
    source tree that was never installed, where no distribution metadata exists."""
    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return "unknown"
