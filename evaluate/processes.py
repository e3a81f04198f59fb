"""Simulations in worker processes: each is CPU-bound pure Python, so threads would not help."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["map_in_processes"]

T = TypeVar("T")
R = TypeVar("R")


def map_in_processes(fn: Callable[[T], R], items: Sequence[T], jobs: int) -> list[R]:
    """`[fn(x) for x in items]`, in up to `jobs` worker processes when there is more than one
    item and job (forked where the platform can: the workers start without re-importing)."""
    if jobs <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=ctx) as pool:
        return list(pool.map(fn, items))
