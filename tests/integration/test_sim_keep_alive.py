"""The twin closes idle connections as SGLang's server does (uvicorn's `timeout_keep_alive` from
SGLANG_TIMEOUT_KEEP_ALIVE), so a client that keeps them longer meets the closes it would meet."""

from __future__ import annotations

import os
import socket
import subprocess

from tests.support import free_port, running, specroute


def _idle_connection_is_closed(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: twin\r\nConnection: keep-alive\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(4096)
        assert head.startswith(b"HTTP/1.1 200"), head
        try:
            while chunk := s.recv(4096):  # the rest of the answer, then the server's close
                assert not chunk.startswith(b"HTTP/"), "one request, one answer"
        except TimeoutError:
            return False  # still open after 30 s of idling
        return True


def test_an_idle_connection_is_closed_after_sglang_timeout_keep_alive():
    port = free_port()
    cmd = specroute("sim", "--profile", "zero", "--port", str(port))
    with running(cmd, ready_url=f"http://127.0.0.1:{port}/ready", env={"SGLANG_TIMEOUT_KEEP_ALIVE": "1"}):
        assert _idle_connection_is_closed(port)


def test_a_keep_alive_that_is_not_an_integer_is_refused_by_name():
    env = {"SGLANG_TIMEOUT_KEEP_ALIVE": "five"}
    cmd = specroute("sim", "--profile", "zero", "--port", str(free_port()))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert proc.returncode != 0 and "SGLANG_TIMEOUT_KEEP_ALIVE: 'five' is not a valid integer value" in proc.stderr
