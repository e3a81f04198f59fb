#!/usr/bin/env python3
"""A Docker engine of our own for the container tests, and a base image made from Debian packages.

Machines without a container registry can still build and run the project's image: Debian's `docker.io`
brings dockerd, and `debootstrap --variant=minbase` of the host's own Debian suite (with python3 and
the host's extra CA certificates, for a TLS-intercepting proxy) stands in for the official Python base
image. The tarball is cached (SPECROUTE_CACHE, default /var/cache/specroute) and imported in seconds.

The engine is private: its own socket, exec root and pid file, so it never meets a system dockerd's
state. Starting it changes the host's networking (ip_forward on, iptables chains and the FORWARD policy
DROP, a docker0 bridge); `Engine.stop` puts ip_forward, the filter and nat tables and the bridge back as
they were. A Docker engine that already answers on the default socket is used as it is and left alone.

    python3 deploy/local/dockerhost.py check            # can docker run here? (the reason if not)
    python3 deploy/local/dockerhost.py run -- CMD ...   # engine up, base image ready, CMD, engine down

`run` gives CMD `DOCKER_HOST` and `SPECROUTE_BASE_IMAGE` (build with --build-arg BASE=...). Stdlib only:
the tests import it from the repository, and it runs with the system python3 too.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

CACHE = Path(os.environ.get("SPECROUTE_CACHE", "/var/cache/specroute"))
# What the base image holds beyond minbase: what the Dockerfile's two stages need (python3 -m venv,
# pip's TLS trust) and what the local Prometheus stand-in's apt-get needs (ca-certificates).
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
SYSTEM_SOCKET = Path("/var/run/docker.sock")


def _run(
    argv: Sequence[str], *, check: bool = True, timeout: float = 120, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, timeout=timeout, capture_output=True, text=True, input=input)


def docker_client() -> str | None:
    """The client from the same package as dockerd when there is one: a newer standalone client may
    default to a builder plugin (buildx) that the engine's package does not ship."""
    beside = Path("/usr/bin/docker")
    return str(beside) if beside.exists() else shutil.which("docker")


def host_suite() -> str:
    """The host's Debian suite (bookworm, trixie, ...), from /etc/os-release."""
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip().strip('"')
    raise RuntimeError("/etc/os-release has no VERSION_CODENAME: not a Debian-family host")


def host_mirror(suite: str) -> str:
    """The archive the host's own apt uses for its suite (deb822 .sources or one-line sources.list)."""
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in sources:
        for stanza in path.read_text().split("\n\n"):
            fields = dict(
                line.split(":", 1) for line in stanza.splitlines() if ":" in line and not line.startswith("#")
            )
            if suite in fields.get("Suites", "").split() and "deb" in fields.get("Types", "").split():
                return fields["URIs"].split()[0]
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list"))]:
        if path.exists():
            for line in path.read_text().splitlines():
                words = [w for w in line.split() if not w.startswith("[")]
                if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
                    return words[1]
    raise RuntimeError(f"no apt source for suite {suite} on this host")


def unavailable_reason() -> str | None:
    """Why docker cannot run here, or None. The tests skip with this sentence."""
    client = docker_client()
    if client is None:
        return "no docker client (Debian: apt-get install docker.io)"
    if _system_engine_answers(client):
        return None
    if os.geteuid() != 0:
        return "starting a Docker engine needs root"
    missing = [b for b in ("dockerd", "containerd", "runc", "debootstrap", "iptables") if shutil.which(b) is None]
    if missing:
        return f"missing {', '.join(missing)} (Debian: apt-get install docker.io debootstrap)"
    if not Path("/proc/sys/net/ipv4/ip_forward").exists():
        return "no /proc/sys/net/ipv4/ip_forward (no network namespace support)"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlay filesystem (dockerd's overlay2 storage driver)"
    try:
        host_mirror(host_suite())
    except (OSError, RuntimeError) as e:
        return f"no Debian base for the image: {e}"
    return None


def _system_engine_answers(client: str) -> bool:
    if not SYSTEM_SOCKET.exists():
        return False
    try:
        return _run([client, "-H", f"unix://{SYSTEM_SOCKET}", "version"], check=False, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class HostNetwork:
    """What starting dockerd changes on the host, taken before and put back after."""

    TABLES = ("filter", "nat")

    def __init__(self) -> None:
        self.ip_forward = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
        self.tables = {t: _run(["iptables-save", "-t", t]).stdout for t in self.TABLES}
        self.links = self._links()

    @staticmethod
    def _links() -> set[str]:
        return {p.name for p in Path("/sys/class/net").iterdir()}

    @staticmethod
    def forward_policy() -> str:
        first = _run(["iptables", "-S", "FORWARD"]).stdout.splitlines()[0]  # "-P FORWARD ACCEPT"
        return first.split()[-1]

    def restore(self) -> None:
        for table, saved in self.tables.items():
            _run(["iptables-restore", "-T", table], input=saved)
        Path("/proc/sys/net/ipv4/ip_forward").write_text(self.ip_forward + "\n")
        for link in sorted(self._links() - self.links):  # docker0 and the compose networks' bridges
            if link.startswith(("docker", "br-")):
                _run(["ip", "link", "delete", link], check=False)


def stale_engines(data_root: Path) -> list[int]:
    """Pids of the dockerd processes serving `data_root`: ours from an earlier run that was killed
    before it could stop them (they run in their own session, so they outlive it). Such an engine
    keeps the data root locked, and a new one on it never answers."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if argv and Path(argv[0].decode(errors="replace")).name == "dockerd":
            args = [a.decode(errors="replace") for a in argv[1:]]
            if any(args[i] == "--data-root" and args[i + 1] == str(data_root) for i in range(len(args) - 1)):
                pids.append(int(entry.name))
    return pids


def stop_stale_engines(data_root: Path, timeout: float = 30) -> list[int]:
    """Stops the engines `stale_engines` finds, with their process groups (containerd, shims): SIGTERM,
    then SIGKILL after `timeout`. Returns their pids."""
    pids = stale_engines(data_root)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(pid), sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(_running(pid) for pid in pids):
            time.sleep(0.1)
        if not any(_running(pid) for pid in pids):
            break
    return pids


def _running(pid: int) -> bool:
    """Alive, and not a zombie waiting for its parent to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


class Engine:
    """dockerd on a private socket (or the system's engine when one answers); `docker(...)` runs the client."""

    def __init__(self, cache: Path = CACHE) -> None:
        client = docker_client()
        if client is None:
            raise RuntimeError("no docker client")
        self.client = client
        self.cache = cache
        self.proc: subprocess.Popen[bytes] | None = None
        self.network: HostNetwork | None = None
        self.run_dir: Path | None = None
        self.host = f"unix://{SYSTEM_SOCKET}"
        self.log_path: Path | None = None

    @property
    def env(self) -> dict[str, str]:
        # BuildKit: the Dockerfile's pip cache mount (docker.io 20.10's client still defaults to the old builder).
        return {**os.environ, "DOCKER_HOST": self.host, "DOCKER_BUILDKIT": "1"}

    def docker(
        self, *args: str, check: bool = True, timeout: float = 300, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [self.client, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            input=input,
            check=False,
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} -> {out.returncode}: {out.stderr.strip()[-2000:]}")
        return out

    def start(self, timeout: float = 60) -> Engine:
        if _system_engine_answers(self.client):
            return self
        data_root = self.cache / "docker"  # images and build cache survive between runs
        data_root.mkdir(parents=True, exist_ok=True)
        stale = stop_stale_engines(data_root)
        if stale:
            print(f"dockerhost: stopped an earlier run's engine on {data_root} (pids {stale})", file=sys.stderr)
        self.network = HostNetwork()
        self.run_dir = Path(tempfile.mkdtemp(prefix="specroute-dockerd-", dir="/run"))
        self.host = f"unix://{self.run_dir / 'docker.sock'}"
        self.log_path = self.run_dir / "dockerd.log"
        argv = [
            "dockerd",
            "--host",
            self.host,
            "--data-root",
            str(data_root),
            "--exec-root",
            str(self.run_dir / "exec"),
            "--pidfile",
            str(self.run_dir / "docker.pid"),
            "--storage-driver=overlay2",
            "--exec-opt",
            "native.cgroupdriver=cgroupfs",
            "--shutdown-timeout",
            "5",
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self.docker("version", check=False, timeout=10).returncode == 0:
                return self
            time.sleep(0.3)
        tail = self.log_path.read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"dockerd did not start within {timeout:.0f}s:\n{tail}")

    def stop(self) -> None:
        """Stop what we started (containers go with dockerd's shutdown) and put the host network back."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=10)
            self.proc = None
        if self.network is not None:
            self.network.restore()
            self.network = None
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def remove_leftovers(self) -> None:
        """On our own engine only: containers and networks a killed earlier run left in the data root
        (compose's `restart: unless-stopped` would bring them back with the engine). Images stay."""
        if self.proc is None:
            return  # someone else's engine: not ours to clean
        ids = self.docker("ps", "-aq", timeout=60).stdout.split()
        if ids:
            self.docker("rm", "-f", *ids, timeout=300)
        self.docker("network", "prune", "--force", timeout=120)

    def has_image(self, ref: str) -> bool:
        return self.docker("image", "inspect", ref, check=False, timeout=30).returncode == 0


def _base_key(suite: str, mirror: str) -> str:
    h = hashlib.sha256(f"{suite}\n{mirror}\n{' '.join(BASE_PACKAGES)}\n".encode())
    for cert in sorted(HOST_CA_DIR.glob("**/*.crt")):
        h.update(cert.read_bytes())
    return h.hexdigest()[:12]


def _host_apt_conf() -> str:
    """The host's apt settings a snapshot mirror needs (an old Release file is accepted there)."""
    dump = _run(["apt-config", "dump"], check=False).stdout.splitlines()
    keep = ("Acquire::Check-Valid-Until ", "Acquire::Check-Date ")
    return "".join(line + "\n" for line in dump if line.startswith(keep))


def build_base_tarball(path: Path, suite: str, mirror: str) -> None:
    """debootstrap minbase + BASE_PACKAGES + the host's CA certificates, packed as a rootfs tarball."""
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=path.parent) as tmp:
        root = Path(tmp) / "rootfs"
        out = _run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", suite, str(root), mirror],
            check=False,
            timeout=900,
        )
        if out.returncode != 0:
            raise RuntimeError(f"debootstrap failed:\n{(out.stdout + out.stderr)[-2000:]}")
        for cert in sorted(HOST_CA_DIR.glob("**/*.crt")):
            shutil.copy2(cert, root / "usr/local/share/ca-certificates" / cert.name)
        _run(["chroot", str(root), "update-ca-certificates"])
        (root / "etc/apt/apt.conf.d/99specroute-host").write_text(_host_apt_conf())
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (root / junk).glob("*"):
                if item.is_file():
                    item.unlink()
        partial = path.with_suffix(".partial")
        with tarfile.open(partial, "w") as tar:
            tar.add(root, arcname=".")
        partial.rename(path)  # a killed run never leaves a half tarball under the final name


def base_image(engine: Engine) -> str:
    """The local base image's tag: imported from the cached tarball, built first when missing."""
    suite = host_suite()
    mirror = host_mirror(suite)
    tag = f"specroute-base:{suite}-{_base_key(suite, mirror)}"
    if engine.has_image(tag):
        return tag
    tarball = engine.cache / "base" / f"{tag.replace(':', '-')}.tar"
    tarball.parent.mkdir(parents=True, exist_ok=True)
    if not tarball.exists():
        for old in tarball.parent.glob("specroute-base-*.tar"):
            old.unlink()  # one base at a time: a new CA or suite replaces the old one
        build_base_tarball(tarball, suite, mirror)
    with open(tarball, "rb") as f:
        out = subprocess.run(
            [engine.client, "import", "--change", 'CMD ["/bin/bash"]', "-", tag],
            stdin=f,
            capture_output=True,
            text=True,
            timeout=300,
            env=engine.env,
            check=False,
        )
    if out.returncode != 0:
        raise RuntimeError(f"docker import failed: {out.stderr.strip()}")
    return tag


@contextlib.contextmanager
def engine_with_base(cache: Path = CACHE) -> Iterator[tuple[Engine, str]]:
    with Engine(cache) as engine:
        yield engine, base_image(engine)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dockerhost", description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="print whether docker can run here, and why not")
    r = sub.add_parser("run", help="engine up, base image ready, run CMD with DOCKER_HOST set, engine down")
    r.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    reason = unavailable_reason()
    if args.command == "check":
        print(f"docker cannot run here: {reason}" if reason else "docker can run here")
        return 1 if reason else 0
    if reason:
        print(f"dockerhost: docker cannot run here: {reason}", file=sys.stderr)
        return 1
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        p.error("run needs a command, e.g. run -- bash")
    with engine_with_base() as (engine, base):
        env = {**engine.env, "SPECROUTE_BASE_IMAGE": base}
        print(f"dockerhost: DOCKER_HOST={engine.host} SPECROUTE_BASE_IMAGE={base}", file=sys.stderr)
        return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
