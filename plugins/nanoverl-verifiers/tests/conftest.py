"""Shared helpers: the fixture environments (fixture_envs/, written with verifiers' own API), a tiny
from-scratch model with a ChatML-like template, and `nanoverl-train` as a user runs it. No hub, one thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
ENVS = HERE / "fixture_envs"
TOOL_ENV = f"{ENVS / 'tool_env.py'}:load_tool_environment"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# "vf-arith" is found as verifiers finds an installed environment: its module on the Python path, here and in
# the agent workers (fresh interpreters that inherit this environment)
os.environ["PYTHONPATH"] = os.pathsep.join([str(ENVS), *filter(None, [os.environ.get("PYTHONPATH")])])
sys.path.insert(0, str(ENVS))


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory):
    from nanoverl_hf.tiny import CHATML, PRINTABLE, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "model", alphabet=PRINTABLE, hidden=32,
                            max_positions=1024, chat_template=CHATML)


def cli_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    env.update(extra)
    return env


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`nanoverl-train ARGS` in a subprocess, from the repository root."""
    return subprocess.run([sys.executable, "-m", "nanoverl_core.cli", *args], cwd=ROOT, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one `error:` line of a run that exited 2, without a traceback."""
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr[-3000:])
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def records(folder: Path) -> list[dict]:
    """What the vf-arith rubric saw, one dict per scored rollout."""
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
