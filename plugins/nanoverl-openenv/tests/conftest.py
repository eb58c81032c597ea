"""Shared helpers: the fixture game (fixture_env/guess_number.py, written with OpenEnv's own API), its data rows,
an OpenEnv server serving it (uvicorn on 127.0.0.1, a free port, a subprocess), and `nanoverl-train` as a user
runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
GAME = HERE / "fixture_env" / "guess_number.py"
CONFIG = HERE / "guess.toml"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def cli_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`nanoverl-train ARGS` in a subprocess, from the repository root."""
    return subprocess.run([sys.executable, "-m", "nanoverl_core.cli", *args], cwd=ROOT, env=env or cli_env(),
                          capture_output=True, text=True, timeout=timeout)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one `error:` line of a run that exited 2, without a traceback."""
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr[-3000:])
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def write_rows(path: Path, seeds: range, max_guesses=lambda seed: 3) -> Path:
    """One row per seed: the prompt "<seed>:<max_guesses>?" (holding the reset observation "<max_guesses>?"),
    and reset's arguments under "reset"."""
    rows = [{"prompt": f"{s}:{max_guesses(s)}?", "target": "0", "reset": {"seed": s, "max_guesses": max_guesses(s)}}
            for s in seeds]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Server:
    """`uvicorn guess_number:app` on 127.0.0.1 (OpenEnv's app, OpenEnv's server), stopped by `stop()`."""

    def __init__(self, tmp: Path, port: int | None = None, **env: str):
        from nanoverl_openenv.server import free_port, get_json

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp / f"server-{self.port}-{time.monotonic_ns()}.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "guess_number:app", "--app-dir",
                                      str(GAME.parent), "--host", "127.0.0.1", "--port", str(self.port)],
                                     env=cli_env(**env), stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                get_json(self.url, "/health", timeout=1.0)     # straight to 127.0.0.1, whatever $http_proxy says
                return
            except ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise AssertionError(f"the OpenEnv server at {self.url} did not start") from None
                time.sleep(0.1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()


@pytest.fixture
def serve(tmp_path):
    """serve(**env) -> a running Server of the fixture game; every one is killed after the test."""
    started: list[Server] = []

    def start(port: int | None = None, **env: str) -> Server:
        started.append(Server(tmp_path, port, **env))
        return started[-1]

    yield start
    for server in started:
        server.kill()


def alive(pid: int, wait_s: float = 0.0) -> bool:
    """The process runs (a zombie, which no one has reaped yet, does not), after waiting up to `wait_s` for it to end."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        if state == "Z":
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.1)
