"""Fixtures of the judge tests: scripted judge servers (judge_servers.py) as real processes on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nanoverl_judge import server

HERE = Path(__file__).parent
ROOT = HERE.parents[2]


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, log: Path):
        self.proc, self.url, self.log = proc, url, log

    def requests(self) -> list[dict]:
        """Every request the server received: {"body", "behaviour", "n"}."""
        if not self.log.is_file():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]


def wait_until_up(url: str, proc: subprocess.Popen | None = None, timeout: float = 60) -> None:
    why = server.wait_until_up(url, proc, timeout)
    if why is not None:
        raise RuntimeError(f"{url}: {why}")


@pytest.fixture
def judge_server(tmp_path):
    """start(behaviour, die_after=0) -> Server; every server started is killed at the end."""
    started: list[subprocess.Popen] = []

    def start(behaviour: str, die_after: int = 0) -> Server:
        n = len(started)
        port_file, log = tmp_path / f"server{n}.port", tmp_path / f"server{n}.log"
        proc = subprocess.Popen([sys.executable, str(HERE / "judge_servers.py"), behaviour, "--port-file",
                                 str(port_file), "--log", str(log), "--die-after", str(die_after)])
        started.append(proc)
        deadline = time.monotonic() + 60
        while not port_file.is_file():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the scripted judge server did not start")
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port_file.read_text()}/v1"
        wait_until_up(url, proc)
        return Server(proc, url, log)

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def cli_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1", **extra}


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanoverl_core.cli", *args], cwd=ROOT, env=env or cli_env(),
                          capture_output=True, text=True, timeout=timeout)
