"""The config file, watched: a change on disk is applied as SIGHUP applies it.

Several replicas read one file (a Kubernetes ConfigMap mounted as a directory); an edit must reach
all of them, not the one pod a `POST /admin/reload` through the Service happens to reach.

How it watches: the file's `stat` every `gateway.config_watch_s` (1 s), following symlinks. The
kubelet updates a ConfigMap volume by writing a new directory and swapping the `..data` symlink to
it, so the path's inode changes and the old file is never rewritten in place; an editor that
rewrites the file changes its size or modification time. Polling a stat needs no inotify watch
(whose watch on a symlinked file follows the old target, not the swap) and costs microseconds.

A change is applied once the file has held still for one more poll, so a file being written is not
read half-way, and only if its bytes differ from what was last applied (a `touch` reloads nothing).
The reload is the same as SIGHUP's and `POST /admin/reload`'s, with its checks: a file that is
missing, does not parse, fails validation or has no backends is refused, logged once, and the
running config stays until the file changes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

__all__ = ["ConfigWatch"]

log = logging.getLogger("specroute.config_watch")

# What tells one version of the file from another without reading it.
Signature = tuple[int, int, int, int]  # (device, inode, size, modification time in ns)


class ConfigWatch:
    def __init__(
        self,
        path: str | Path,
        reload: Callable[[], Awaitable[object]],
        interval_s: Callable[[], float],
    ) -> None:
        """`reload`: applies the file (raises when it refuses it); `interval_s`: the poll period, read
        at each poll (a reload may change it; 0 pauses the watch)."""
        self.path = Path(path)
        self.reload = reload
        self.interval_s = interval_s
        self.applied: str | None = None  # digest of the bytes last applied (or running at the start)
        self.refused: str | None = None  # digest of the bytes last refused: not tried again
        self.current = True  # the running config is what the file holds (False: refused or unreadable)
        self.reloads = 0  # changes applied by this watch
        self._seen: Signature | None = None  # the file's signature at the last poll
        self._settled: Signature | None = None  # the signature last read (applied or refused)
        self._settled_current = True  # what it holds is what runs
        self._missing = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Take the file as it is now for the running config's, and poll from now on."""
        signature, data = _read(self.path)
        self._seen = self._settled = signature
        self.applied = _digest(data) if data is not None else None
        self._task = asyncio.create_task(self._run(), name="config-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            interval = self.interval_s()
            await asyncio.sleep(interval if interval > 0 else 1.0)
            if interval <= 0:
                continue
            try:
                await self.poll()
            except Exception:  # never the end of the watch
                log.exception("watching %s failed", self.path)

    async def poll(self) -> None:
        """One look at the file: apply it if it changed and has held still since the last look."""
        signature = _signature(self.path)
        if signature is None:
            if not self._missing:
                log.error("config file %s is missing: the running config is kept", self.path)
                self._missing, self.current = True, False
            self._seen = None
            return
        if self._missing:
            log.warning("config file %s is back", self.path)
            self._missing = False
        previous, self._seen = self._seen, signature
        if signature == self._settled:
            self.current = self._settled_current  # unchanged (or back as it was)
            return
        if signature != previous:
            return  # changed since the last look: it may still be being written
        signature, data = await asyncio.to_thread(_read, self.path)
        if data is None or signature != self._seen:
            return  # gone or changed again while read: the next polls settle it
        self._settled = signature
        digest = _digest(data)
        if digest == self.applied or digest == self.refused:
            self.current = self._settled_current = digest == self.applied
            return
        try:
            await self.reload()
        except Exception as e:
            self.refused, self.current = digest, False
            self._settled_current = False
            log.error("config file %s changed and was refused, the running config is kept: %s", self.path, _text(e))
            return
        self.applied, self.refused, self.current = digest, None, True
        self._settled_current = True
        self.reloads += 1
        log.warning("config file %s changed: applied", self.path)


def _signature(path: Path) -> Signature | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _read(path: Path) -> tuple[Signature | None, bytes | None]:
    """The file's signature and bytes, the signature taken before the read (a change during it shows)."""
    signature = _signature(path)
    try:
        return signature, path.read_bytes()
    except OSError:
        return None, None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _text(error: Exception) -> str:
    message = getattr(error, "message", None)  # an ApiError says it in `message`
    return message if isinstance(message, str) else str(error) or type(error).__name__
