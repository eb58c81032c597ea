"""Shared helpers: real torchrun launches (gloo, CPU), tiny models and data in temporary folders.

Every launch is a fresh `python -m torch.distributed.run --standalone` (an ephemeral rendezvous
port, so concurrent runs do not collide), one thread per process, no hub access.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
EXAMPLE = ROOT / "examples" / "configs" / "tiny_grpo_fsdp.toml"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def env(**extra: str) -> dict[str, str]:
    out = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    out.update(extra)
    return out


def torchrun(nproc: int, *args: str) -> list[str]:
    """The torchrun command line for `args` (a script path or `-m module`, then its arguments)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]


def run(cmd: list[str], *, timeout: float = 120, check: bool = True, **env_extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=ROOT, env=env(**env_extra), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def assert_same_update(hf: dict, fsdp: dict, atol: float) -> None:
    """update_driver's results of one process (`hf`) and of 2 FSDP ranks (`fsdp`): the same start, the same
    log-probs, values and metrics, and the same actor and critic parameters after the update, to `atol`."""
    import torch

    assert all(torch.equal(hf["initial"][k], fsdp["initial"][k]) for k in hf["initial"])   # same start
    for key in ("log_probs", "ref_log_probs", "values", "odd_log_probs"):
        torch.testing.assert_close(fsdp[key], hf[key], atol=atol, rtol=0, msg=key)
    for key in ("critic_metrics", "actor_metrics", "odd_actor_metrics"):
        assert fsdp[key].keys() == hf[key].keys()
        for name, want in hf[key].items():
            assert fsdp[key][name] == pytest.approx(want, abs=atol), (key, name)
    for model in ("actor", "critic"):
        assert fsdp[model].keys() == hf[model].keys()
        for name, want in hf[model].items():
            torch.testing.assert_close(fsdp[model][name], want, atol=atol, rtol=0, msg=f"{model} {name}")


def read_metrics(run_dir: Path) -> dict[int, dict]:
    """metrics.jsonl as {step: metrics}; a step logged twice (before a kill and after resume) keeps the last."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {row["step"]: row for row in rows}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from nanoverl_hf.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def testkit_site(tmp_path_factory) -> Path:
    """A folder to put on PYTHONPATH that installs the test plugin (rollout `hf_per_prompt`):
    the module and a hand-written .dist-info with its entry point, which importlib.metadata finds."""
    site = tmp_path_factory.mktemp("testkit-site")
    (site / "nanoverl_fsdp_testkit.py").write_text((HERE / "testkit" / "nanoverl_fsdp_testkit.py").read_text())
    info = site / "nanoverl_fsdp_testkit-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nanoverl-fsdp-testkit\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[nanoverl]\nnanoverl-fsdp-testkit = nanoverl_fsdp_testkit\n")
    return site
