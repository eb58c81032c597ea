"""Shared helpers: the real CLI in a subprocess, from the checkout's root (where the example configs are)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "configs"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def cli_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1", **extra}


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300):
    """`nanoverl-train ARGS` as a user runs it: a real subprocess, stdout/stderr captured."""
    return subprocess.run([sys.executable, "-m", "nanoverl_core.cli", *args], cwd=ROOT, env=env or cli_env(),
                          capture_output=True, text=True, timeout=timeout)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
