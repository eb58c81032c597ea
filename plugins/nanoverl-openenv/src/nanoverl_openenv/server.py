"""OpenEnv servers over HTTP: the checks of a running one (/health, /schema, each with a timeout), and the one
the plugin starts for `app`.

A started server belongs to the process that holds the episodes (an environment worker, or the trainer with
environment.workers = 0): `python -m nanoverl_openenv.server APP PORT PARENT_PID` serves the app with uvicorn
on 127.0.0.1, on a port that was free, and dies with its parent (PR_SET_PDEATHSIG, and a thread watching the
parent's pid), so a worker killed for a timeout or a crash takes its server with it; a worker that ends
normally stops it (atexit). A server found dead when an episode starts is started again, on a new port:
the episodes it held have failed already (their WebSocket dropped), later ones go on.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from nanoverl_core.errors import one_line

from .refs import load_ref


def http_url(url: str) -> str:
    """A server's base URL as http(s), whichever scheme the settings gave (OpenEnv clients take both)."""
    url = url.rstrip("/")
    for ws, http in (("ws://", "http://"), ("wss://", "https://")):
        if url.startswith(ws):
            return http + url[len(ws):]
    return url


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Requests to this machine go to it, whatever $http_proxy says (as OpenEnv's client does for its WebSocket)."""


def get_json(url: str, path: str, timeout: float) -> dict[str, Any]:
    """GET url + path as JSON; a ConnectionError saying why not (refused, timed out, not JSON, HTTP error)."""
    local = urllib.parse.urlsplit(http_url(url)).hostname in ("127.0.0.1", "localhost", "::1")
    try:
        with (_DIRECT.open if local else urllib.request.urlopen)(http_url(url) + path, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise ConnectionError(f"GET {path} answered HTTP {exc.code}") from None
    except urllib.error.URLError as exc:          # refused, no such host
        raise ConnectionError(f"GET {path} failed: {exc.reason}") from None
    except (OSError, ValueError) as exc:          # a timeout or a reset mid-answer; an answer that is not JSON
        raise ConnectionError(f"GET {path} failed: {one_line(exc)}") from None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class StartedServer:
    """The uvicorn process serving one app ref for this process (see the module docstring)."""

    def __init__(self, app: str, start_timeout_s: float):
        self.app, self.start_timeout_s = app, start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.base = ""

    def url(self) -> str:
        """The base URL of the running server, started (again) if it is not running."""
        if self.proc is not None and self.proc.poll() is None:
            return self.base
        if self.proc is not None:
            print(f"warning: the OpenEnv server of environment.openenv.app = {self.app!r} exited "
                  f"({self.proc.returncode}); starting it again", file=sys.stderr)
        self._start()
        return self.base

    def _start(self) -> None:
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "nanoverl_openenv.server", self.app, str(port),
                                      str(os.getpid())], stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the OpenEnv server of environment.openenv.app = {self.app!r} exited with status "
                                   f"{self.proc.returncode} before it answered: {self._tail()}")
            try:
                get_json(self.base, "/health", timeout=1.0)
                return
            except ConnectionError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"the OpenEnv server of environment.openenv.app = {self.app!r} did not answer /health "
                           f"within environment.openenv.start_timeout_s={self.start_timeout_s:g}s: {self._tail()}")

    def _tail(self) -> str:
        self.log.seek(0)
        lines = [line for line in self.log.read().decode(errors="replace").splitlines() if line.strip()]
        return " | ".join(lines[-3:])[-600:] or "it printed nothing"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_STARTED: dict[str, StartedServer] = {}


def started_url(app: str, start_timeout_s: float) -> str:
    """The base URL of this process's server for `app` (started on first use, stopped when the process ends)."""
    if not _STARTED:
        atexit.register(stop_started)
    server = _STARTED.setdefault(app, StartedServer(app, start_timeout_s))
    return server.url()


def stop_started() -> None:
    for server in _STARTED.values():
        server.stop()


# ---- the server process -----------------------------------------------------------------------------------
def _die_with(parent: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG: die with the thread that started us
        except (OSError, AttributeError):
            pass

    def watch() -> None:                                # and with the process, whichever thread started us
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def main(argv: list[str]) -> None:
    import uvicorn

    app, port, parent = argv[0], int(argv[1]), int(argv[2])
    _die_with(parent)
    uvicorn.run(load_ref(app), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
