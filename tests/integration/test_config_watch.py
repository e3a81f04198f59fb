"""One config across replicas (gateway/config_watch.py): three `specroute-gateway` processes on one
file, laid out as the kubelet lays out a ConfigMap volume (`config.toml -> ..data/config.toml`,
`..data -> ..<version>/`, an update swapping the `..data` symlink). A change on disk reaches every
replica without a restart; a bad, half-written or missing file keeps the running config, logged."""

from __future__ import annotations

import contextlib
import os
import re
import time
import urllib.request
from pathlib import Path

from tests.support import BIN, free_port, get_json, output, running, wait_until

BACKENDS = ("a", "m")


def _toml(*backends: tuple[str, str]) -> str:
    lines = ["[health]\ninterval_s = 0.5\n"]  # the default config_watch_s (1 s)
    for name, model in backends:
        lines.append(f'[[backends]]\nname = "{name}"\nurl = "http://127.0.0.1:{free_port()}"\nmodel = "{model}"\n')
    return "\n".join(lines)


class ConfigMapVolume:
    """A directory as the kubelet keeps a ConfigMap volume: each version in a directory of its own,
    `..data` a symlink to the current one, the file a symlink through `..data`."""

    def __init__(self, root: Path, name: str = "config.toml") -> None:
        self.root, self.name, self.versions = root, name, 0
        (root / name).symlink_to(Path("..data") / name)

    @property
    def path(self) -> Path:
        return self.root / self.name

    def update(self, text: str) -> None:
        self.versions += 1
        version = self.root / f"..v{self.versions}"
        version.mkdir()
        (version / self.name).write_text(text)
        link = self.root / "..data_tmp"
        link.symlink_to(version.name)
        os.replace(link, self.root / "..data")  # the atomic swap


def _digest(url: str) -> str | None:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        found = re.search(r'specroute_config_info\{digest="(\w+)"\} 1\.0', r.read().decode())
    return found.group(1) if found else None


def _applied(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        found = re.search(r"^specroute_config_file_applied (\S+)$", r.read().decode(), re.M)
    assert found is not None
    return float(found.group(1))


def _models(url: str) -> set[str]:
    return {card["id"] for card in get_json(f"{url}/v1/models")["data"]}


def test_a_change_on_disk_reaches_every_replica_and_a_bad_file_changes_nothing(tmp_path):
    volume = ConfigMapVolume(tmp_path)
    volume.update(_toml(("a", "m1")))
    ports = [free_port() for _ in range(3)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(
                running(
                    [
                        str(BIN / "specroute-gateway"),
                        "serve",
                        "--config",
                        str(volume.path),
                        "--listen",
                        f"127.0.0.1:{p}",
                    ],
                    ready_url=f"{url}/health",
                )
            )
            for p, url in zip(ports, urls, strict=True)
        ]
        first = {_digest(url) for url in urls}
        assert len(first) == 1 and None not in first  # one file, one digest, whatever each listens on

        # a new version of the ConfigMap: every replica serves the new model, none restarted
        started = time.monotonic()
        volume.update(_toml(("a", "m1"), ("b", "m2")))
        assert wait_until(lambda: all(_models(url) == {"m1", "m2"} for url in urls), timeout=30)
        print(f"\nconfig change on disk -> all 3 replicas serving it: {time.monotonic() - started:.1f} s")
        second = {_digest(url) for url in urls}
        assert len(second) == 1 and second != first
        assert all(proc.poll() is None for proc in procs)

        # not TOML: refused, logged, the running config kept, the refusal visible in /metrics
        volume.update('[gateway\nlisten = "')
        assert wait_until(lambda: all(_applied(url) == 0 for url in urls), timeout=30)
        assert all("changed and was refused, the running config is kept" in output(p) for p in procs)
        assert {_digest(url) for url in urls} == second and all(_models(url) == {"m1", "m2"} for url in urls)

        # half-written, in place: the first part of a valid file holds still, and is refused (no backends)
        target = volume.root / "..data" / volume.name
        full = _toml(("c", "m3"))
        with open(target, "w") as f:
            f.write(full[: full.index("[[backends]]")])
            f.flush()
            assert wait_until(lambda: all("has no backends" in output(p) for p in procs), timeout=30)
            assert all(_models(url) == {"m1", "m2"} for url in urls)
            f.write(full[full.index("[[backends]]") :])
        assert wait_until(lambda: all(_models(url) == {"m3"} and _applied(url) == 1 for url in urls), timeout=30)

        # missing: the running config stays; back with the same bytes, nothing to apply
        third = {_digest(url) for url in urls}
        (volume.root / "..data").unlink()
        assert wait_until(lambda: all("is missing: the running config is kept" in output(p) for p in procs), timeout=30)
        assert all(_models(url) == {"m3"} and _applied(url) == 0 for url in urls)
        (volume.root / "..data").symlink_to(f"..v{volume.versions}")
        assert wait_until(lambda: all(_applied(url) == 1 for url in urls), timeout=30)
        assert {_digest(url) for url in urls} == third
