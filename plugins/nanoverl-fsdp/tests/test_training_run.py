"""The example config on 2 torchrun ranks: killed after a checkpoint, resumed, and equal to one process.

Both runs use the test plugin's `hf_per_prompt` rollout (each prompt group sampled from an RNG seeded
by its uid, see testkit/), so the 2-rank run samples exactly the tokens the 1-process run samples.
The reference is the single-process `hf` worker, the path the fsdp worker must reproduce.
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
from conftest import EXAMPLE, HERE, ROOT, env, read_metrics, run, torchrun

from nanoverl_core.testing import check_same_run

STEPS = 4
ARGS = ["--config", str(EXAMPLE), f"trainer.total_steps={STEPS}", "trainer.save_every=2", f"trainer.val_every={STEPS}",
        "data.batch_size=4", "rollout.n=4", "actor.micro_batch_size=4", "rollout.name=hf_per_prompt",
        "trainer.progress=log"]
# Same tokens, same batches: what differs is float32 summation order (two half-batches plus an
# all-reduce vs one batch). Measured over the 4 steps: 1.2e-7 at most (actor/entropy). 1e-5 leaves a
# margin of ~100x and stays far below any real bug (a lost rank, a wrong normaliser: >= 1e-2).
ATOL, RTOL = 1e-5, 1e-5


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts its workers in sessions of their own)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        found += map(int, children)
        todo += map(int, children)
    return found


def kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and its workers at once, as a node failure or a preemption would.
    (Killing only torchrun is not enough: its workers run on, see docs/fsdp.md.)"""
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, testkit_site):
    tmp = tmp_path_factory.mktemp("runs")
    plugin = {"PYTHONPATH": str(testkit_site)}
    one, two = tmp / "one", tmp / "two"
    val = tmp / "val.jsonl"                                           # 8 of the 64 validation prompts: faster
    val.write_text("".join((ROOT / "examples/data/tiny_copy/val.jsonl").read_text().splitlines(True)[:8]))
    # the reward logs which process scored which row (in the trainer process: reward.workers=0)
    args = [*ARGS, f"data.val_files=[{val}]", f"reward.file={HERE / 'logged_reward.py'}", "reward.workers=0"]
    plugin["NANOVERL_TEST_SCORE_LOG"] = str(tmp / "scored_one.log")
    start = time.perf_counter()
    # the hf side's updates run every row whole, as FSDP's training passes do (its log-prob passes share prompts)
    run([sys.executable, "-m", "nanoverl_core.cli", *args, "worker.name=hf", "actor.share_prompts=false",
         f"trainer.output_dir={one}"], timeout=150, **plugin)
    plugin["NANOVERL_TEST_SCORE_LOG"] = str(tmp / "scored_two.log")
    one_s = time.perf_counter() - start

    cmd = torchrun(2, "-m", "nanoverl_core.cli", *args, f"trainer.output_dir={two}")
    with open(tmp / "killed.log", "w") as log:
        # slowed down (1 s per rollout) so that the kill lands between the step-2 checkpoint and the end
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env(NANOVERL_TEST_ROLLOUT_SLEEP="1", **plugin),
                                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 150
        while not (two / "checkpoints" / "step_000002").is_dir():
            assert proc.poll() is None, (tmp / "killed.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 150 s"
            time.sleep(0.05)
        kill_job(proc)
    killed_at = max(read_metrics(two))
    start = time.perf_counter()
    resumed = run(cmd, timeout=150, **plugin)
    return {"one": one, "two": two, "killed_at": killed_at, "resumed": resumed, "scored": tmp,
            "one_s": one_s, "resume_s": time.perf_counter() - start}


def test_killed_two_rank_run_resumes_from_its_checkpoint_and_finishes(runs):
    two = runs["two"]
    assert runs["killed_at"] < STEPS                                  # the kill interrupted the run
    assert "resumed from" in runs["resumed"].stderr and "step_000002" in runs["resumed"].stderr
    assert [p.name for p in sorted((two / "checkpoints").iterdir())] == ["step_000002", "step_000004"]
    assert not list((two / "checkpoints").glob(".tmp-*"))
    assert json.loads((two / "checkpoints" / "step_000004" / "actor" / "shards.json").read_text())["world_size"] == 2
    # rank 0 alone writes the run directory: one metrics line per step, one rollout file per step
    lines = [json.loads(line)["step"] for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert lines == list(range(1, STEPS + 1))
    assert sorted(p.name for p in (two / "rollouts").iterdir()) == [f"step_{s}.jsonl" for s in range(1, STEPS + 1)]
    assert json.loads((two / "config.json").read_text())["config"]["worker"]["name"] == "fsdp"


def test_two_rank_metrics_and_samples_equal_the_one_process_hf_run(runs):
    one = read_metrics(runs["one"])
    assert check_same_run(runs["one"], runs["two"], atol=ATOL, rtol=RTOL) > 40 and "val/reward/mean" in one[STEPS]
    assert one[STEPS]["actor/grad_norm"] > 0 and one[1]["reward/mean"] != one[STEPS]["reward/mean"]


def test_each_rank_scores_its_own_half_of_the_rows_and_the_scores_equal_one_process(runs):
    """Under torchrun each rank calls the reward on its share of the rows only (once every rank scored the
    whole batch: N ranks, N times the reward work); the gathered scores are the one process's (reward/mean
    at every step, checked with every metric by the test above)."""
    def calls_per_process(log: str) -> dict[str, list[str]]:
        by_pid: dict[str, list[str]] = {}
        for line in (runs["scored"] / log).read_text().splitlines():
            pid, _, prompt = line.partition(" ")
            by_pid.setdefault(pid, []).append(prompt)
        return by_pid

    one = calls_per_process("scored_one.log")
    (one_pid,) = one                                   # one process: every call
    launches = list(calls_per_process("scored_two.log").values())
    assert len(launches) == 4                          # 2 ranks x (killed launch, resumed launch)
    rank0, rank1 = launches[2:]                        # the resumed launch ran to the end
    assert len(rank0) == len(rank1) > 0                # half each: 16-row batches, 8-row validation
    steps_after_resume = STEPS - 2                     # the resumed launch scored steps 3-4 and the final val
    assert len(rank0) + len(rank1) == steps_after_resume * 16 + 8
    assert len(one[one_pid]) == STEPS * 16 + 8


def test_run_directory_exports_to_a_transformers_folder(runs):
    from transformers import AutoModelForCausalLM

    from nanoverl_fsdp.export import main

    assert main([str(runs["two"])]) == 0
    model = AutoModelForCausalLM.from_pretrained(runs["two"] / "final_model")
    assert model.config.use_cache and sum(p.numel() for p in model.parameters()) == 83_136


def test_nanoverl_train_export_joins_the_shards_of_a_two_rank_run(runs, tmp_path):
    """`nanoverl-train export` dispatches to the run's worker (fsdp): the same folder as nanoverl_fsdp.export."""
    import torch
    from transformers import AutoModelForCausalLM

    from nanoverl_fsdp.export import full_state_dict

    out = tmp_path / "exported"
    proc = run([sys.executable, "-m", "nanoverl_core.cli", "export", str(runs["two"]), str(out)])
    assert f"wrote {out}" in proc.stdout
    model = AutoModelForCausalLM.from_pretrained(out)
    newest = sorted((runs["two"] / "checkpoints").glob("step_*"))[-1]
    for name, tensor in full_state_dict(newest / "actor").items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0)
