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
    """update_driver's results of one process (`hf`, run with replay=fsdp) and of FSDP ranks (`fsdp`): the
    same start; the same log-probs, values and metrics to `atol`; at every optimizer step of actor and
    critic (each from the same weights: the hf side replays the fsdp side's), the same gradients and the
    same parameters after the step wherever Adam's step is well conditioned (assert_same_adam_step); and
    the same full parameters at the end."""
    import torch

    assert all(torch.equal(hf["initial"][k], fsdp["initial"][k]) for k in hf["initial"])   # same start
    for key in ("log_probs", "ref_log_probs", "values", "odd_log_probs"):
        torch.testing.assert_close(fsdp[key], hf[key], atol=atol, rtol=0, msg=key)
    for key in ("critic_metrics", "actor_metrics", "odd_actor_metrics"):
        assert fsdp[key].keys() == hf[key].keys()
        for name, want in hf[key].items():
            assert fsdp[key][name] == pytest.approx(want, abs=atol), (key, name)
    assert_same_steps(hf, fsdp, atol)
    for model in ("actor", "critic"):
        assert fsdp[model].keys() == hf[model].keys()
        for name, want in hf[model].items():
            torch.testing.assert_close(fsdp[model][name], want, atol=atol, rtol=0, msg=f"{model} {name}")


def assert_same_steps(hf: dict, fsdp: dict, atol: float) -> None:
    """Every optimizer step of actor and critic in update_driver's results, `hf` run with replay=fsdp (so
    both sides take each step from the same weights): the same gradients (as the optimizer saw them), and
    the same parameters after the step to `atol` wherever Adam's step is well conditioned (see
    assert_same_adam_step). After the first step Adam's normalised step m / sqrt(v) mixes the gradient
    with the moments of the earlier ones and so carries its relative rounding: ~1e-10 absolute on a
    gradient just above assert_same_adam_step's 1e-6, 1e-4 relative, times lr 1e-2 gives ~1e-6; atol = 1e-5
    (measured: 7e-7 at most)."""
    from nanoverl_core.testing import assert_same_adam_step

    for model in ("actor", "critic"):
        assert len(fsdp["steps"][model]) == len(hf["steps"][model]) > 0, model
        for got, want in zip(fsdp["steps"][model], hf["steps"][model]):
            assert_same_adam_step(got["params"], want["params"], got["grads"], want["grads"], atol=atol)


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
