"""The reward runtime through the real CLI: rewards that hang, segfault, call os._exit, return a string
or leak memory, scored in worker processes. With reward.on_error = "zero" the run finishes and every
such call is counted and written to reward_errors.jsonl; with "raise" it exits 2 naming the row, and the
newest checkpoint is intact (the same run resumes from it). Also: the timeout holds off the main thread,
and validation counts its failed calls.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from conftest import EXAMPLES, assert_user_error, cli_env, read_metrics, run_cli
from nanoverl_core.testing import score_texts

REINFORCE = str(EXAMPLES / "debug_reinforce.toml")
BASE = ["trainer.progress=none", "trainer.save_every=1", "data.shuffle=false", "rollout.n=2",
        "tracking.trackers=[jsonl]", "trainer.rollout_samples=-1", "reward.workers=2", "reward.timeout_s=2",
        "reward.memory_limit_mb=400"]

FAULTY = '''
import os, signal, time

LEAK = []


def compute_score(prompt, response, sample):
    fault = sample.get("fault", "")
    if fault == "hang":
        while True:
            time.sleep(0.01)
    if fault == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "exit":
        os._exit(3)
    if fault == "string":
        return "ok"
    if fault == "leak":          # grows until the worker's memory limit stops it
        while True:
            LEAK.append(bytearray(16 * 2**20))
    return 1.0
'''
FAULTS = ["hang", "segv", "exit", "string", "leak"]
KIND = {"hang": "timeout", "segv": "crash", "exit": "crash", "string": "invalid", "leak": "memory"}
NEEDLE = {"hang": "timed out after reward.timeout_s=2s", "segv": "killed by SIGSEGV", "exit": "exited with status 3",
          "string": "returned str 'ok'", "leak": "ran out of memory"}


def rows_file(path: Path, faults: list[str]) -> Path:
    rows = [{"prompt": f"{100 + i}=", "target": f"{100 + i}", "fault": fault} for i, fault in enumerate(faults)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def error_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "reward_errors.jsonl").read_text().splitlines()]


def test_with_on_error_zero_every_fault_is_scored_0_counted_and_written(tmp_path):
    reward = tmp_path / "faulty.py"
    reward.write_text(FAULTY)
    train = rows_file(tmp_path / "train.jsonl", [*FAULTS, "", "", ""])      # 8 prompts x 2 samples a step
    val = rows_file(tmp_path / "val.jsonl", ["", "string"])
    run_dir = tmp_path / "run"
    proc = run_cli("--config", REINFORCE, *BASE, "trainer.total_steps=2", "trainer.val_every=2",
                   f"data.train_files=[{train}]", f"data.val_files=[{val}]", "data.batch_size=8",
                   f"reward.file={reward}", "reward.on_error=zero", f"trainer.output_dir={run_dir}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = read_metrics(run_dir)
    for row in metrics:
        assert row["reward/errors"] == 10 and row["reward/timeouts"] == 2 and row["reward/crashes"] == 4
        assert row["reward/mean"] == pytest.approx(6 / 16)                 # 3 good prompts x 2 samples score 1
    assert metrics[-1]["val/reward/errors"] == 1 and metrics[-1]["val/reward/mean"] == pytest.approx(0.5)
    for step in (1, 2):
        rollouts = [json.loads(line) for line in (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
        assert [r["score"] for r in rollouts] == [0.0] * 10 + [1.0] * 6
    written = error_rows(run_dir)
    train_rows = [r for r in written if r["phase"] == "train"]
    assert len(train_rows) == 20 and sorted(r["step"] for r in train_rows) == [1] * 10 + [2] * 10
    for r in train_rows:
        fault = r["row"]["fault"]
        assert r["kind"] == KIND[fault] and NEEDLE[fault] in r["message"], r
        assert r["index"] == FAULTS.index(fault) and r["response"] is not None and r["prompt"]
    (val_row,) = [r for r in written if r["phase"] == "val"]
    assert val_row["row"]["fault"] == "string" and val_row["kind"] == "invalid" and val_row["step"] == 2


@pytest.mark.parametrize("fault", FAULTS)
def test_with_on_error_raise_a_fault_exits_2_naming_the_row_and_the_checkpoint_is_intact(tmp_path, fault):
    reward = tmp_path / "faulty.py"
    reward.write_text(FAULTY)
    train = rows_file(tmp_path / "train.jsonl", ["", "", fault, ""])        # step 1: rows 0-1, step 2: rows 2-3
    run_dir = tmp_path / "run"
    args = ["--config", REINFORCE, *BASE, "trainer.total_steps=3", "data.val_files=[]", "data.batch_size=2",
            f"data.train_files=[{train}]", f"reward.file={reward}", f"trainer.output_dir={run_dir}"]
    proc = run_cli(*args, "reward.on_error=raise", timeout=300)
    line = assert_user_error(proc, f"reward {reward}:compute_score on data row 2", NEEDLE[fault],
                             "reward.on_error=zero", "reward_errors.jsonl")
    assert line.startswith("error: reward ")
    (ckpt,) = (run_dir / "checkpoints").iterdir()                           # step 1's, complete, nothing half-written
    assert ckpt.name.startswith("step_") and int(ckpt.name.removeprefix("step_")) == 1
    assert [r["step"] for r in read_metrics(run_dir)] == [1]
    (written,) = error_rows(run_dir)
    assert written["kind"] == KIND[fault] and written["index"] == 2 and written["row"]["fault"] == fault
    if fault == "segv":  # the checkpoint is complete: the same run resumes from it and finishes
        proc = run_cli(*args, "reward.on_error=zero", timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "resumed from" in proc.stderr and "(step 1)" in proc.stderr
        assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3]
        assert read_metrics(run_dir)[1]["reward/crashes"] == 2


def _scorer(tmp_path, source: str, **overrides):
    from nanoverl_core.config import RewardConfig
    from nanoverl_core.plugins import Registry
    from nanoverl_core.reward import RewardScorer

    reward = tmp_path / "r.py"
    reward.write_text(source)
    cfg = RewardConfig(file=str(reward), **overrides)
    return RewardScorer(cfg, Registry(), run_dir=tmp_path / "run")


def _batch(n: int):
    from nanoverl_core.batch import RLBatch
    return RLBatch({"x": torch.zeros(n)}, {"row": [{"target": "1", "i": i} for i in range(n)],
                                           "prompt_text": ["p"] * n, "index": list(range(n)),
                                           "data_source": ["d"] * n})


def test_a_reward_registered_in_code_runs_in_the_trainer_next_to_a_pooled_file(tmp_path):
    """A worker loads only files and refs, never the plugins: a closure registered in code (no ref a
    worker could import) is called in the trainer, the file's reward in the pool, in one score."""
    from nanoverl_core.config import RewardComponent, RewardConfig
    from nanoverl_core.plugins import Registry
    from nanoverl_core.reward import RewardScorer

    (tmp_path / "length.py").write_text("def compute_score(prompt, response, sample):\n    return len(response) / 4\n")
    registry = Registry()
    registry.add("reward", "half", lambda prompt, response, sample: 0.5, "somebody")
    cfg = RewardConfig(components=[RewardComponent(name="half"),
                                   RewardComponent(file=str(tmp_path / "length.py"), weight=2.0)], workers=1)
    scorer = RewardScorer(cfg, registry, run_dir=tmp_path / "run")
    try:
        assert scorer.in_trainer == [True, False]
        scores, metrics = score_texts(scorer, _batch(2), ["ab", "abcd"])
    finally:
        scorer.close()
    assert scores.tolist() == [1.5, 2.5] and metrics["reward/half/mean"] == 0.5


def test_the_timeout_holds_off_the_main_thread(tmp_path):
    source = ("import time\ndef compute_score(prompt, response, sample):\n"
              "    if sample['i'] == 1:\n        while True:\n            pass\n    return 0.5\n")
    scorer = _scorer(tmp_path, source, workers=2, timeout_s=0.5, on_error="zero")
    out = {}
    thread = threading.Thread(target=lambda: out.update(result=score_texts(scorer, _batch(4), ["a", "b", "c", "d"])))
    thread.start()
    thread.join(60)
    scorer.close()
    scores, metrics = out["result"]
    assert scores.tolist() == [0.5, 0.0, 0.5, 0.5]
    assert metrics["reward/timeouts"] == 1 and metrics["reward/errors"] == 1


def test_with_workers_0_a_timeout_is_a_timeout_even_inside_except_exception(tmp_path):
    """In the trainer (reward.workers = 0) the timeout is SIGALRM raised into the call: a reward that catches
    Exception around its work (math-verify does) still times out, counted as one, and the next row scores."""
    source = ("def compute_score(prompt, response, sample):\n    try:\n        while sample['i'] == 1:\n"
              "            pass\n    except Exception:\n        return 0.75\n    return 0.5\n")
    scorer = _scorer(tmp_path, source, workers=0, timeout_s=0.5, on_error="zero")
    scores, metrics = score_texts(scorer, _batch(3), ["a", "b", "c"])
    assert scores.tolist() == [0.5, 0.0, 0.5]
    assert metrics["reward/timeouts"] == 1 and metrics["reward/errors"] == 1
    (written,) = error_rows(tmp_path / "run")
    assert written["kind"] == "timeout" and written["message"] == "timed out after reward.timeout_s=0.5s"


def test_workers_0_scores_in_process_like_the_pool(tmp_path):
    source = "def compute_score(prompt, response, sample):\n    return {'score': len(response) / 4, 'i': sample['i']}\n"
    texts = ["a", "bb", "ccc", "dddd", "", "ee"]
    results = []
    for workers in (0, 3):
        scorer = _scorer(tmp_path, source, workers=workers)
        results.append(score_texts(scorer, _batch(6), texts))
        scorer.close()
    (s0, m0), (s3, m3) = results
    assert s0.tolist() == s3.tolist() == [0.25, 0.5, 0.75, 1.0, 0.0, 0.5]
    assert m0 == m3 and m0["reward/i"] == pytest.approx(2.5)


# ---- batched rewards (a reward model, TRL's functions) in their own worker process ---------------------------
BATCHED_FAULTY = '''
import os, signal, time


def compute_score(prompts, responses, samples):
    faults = {sample.get("fault", "") for sample in samples}
    if "hang" in faults:
        while True:
            time.sleep(0.01)
    if "segv" in faults:     # the reward model's process dies in the middle of a batch
        os.kill(os.getpid(), signal.SIGKILL)
    with open(os.environ["NANOVERL_TEST_PIDS"], "a") as log:
        log.write(f"{os.getpid()} {os.getppid()}\\n")
    return [1.0] * len(prompts)


compute_score.batched = True
'''


@pytest.mark.parametrize("fault", ["segv", "hang"])
def test_a_batched_reward_that_dies_or_hangs_costs_its_step_not_the_run(tmp_path, fault):
    """A batched reward runs in its own worker process: one killed (SIGKILL) or hung (past
    reward.timeout_s per row) mid-batch fails that step's rows (counted, written), a fresh worker scores
    the next step; with on_error = "raise" the run stops with one line and its newest checkpoint intact."""
    reward = tmp_path / "batched.py"
    reward.write_text(BATCHED_FAULTY)
    pids = tmp_path / "pids.log"
    train = rows_file(tmp_path / "train.jsonl", ["", "", fault, ""])        # step 2's batch holds the fault
    run_dir = tmp_path / "run"
    args = ["--config", REINFORCE, *BASE, "reward.timeout_s=1", "trainer.total_steps=3", "data.val_files=[]",
            "data.batch_size=2", f"data.train_files=[{train}]", f"reward.file={reward}", f"trainer.output_dir={run_dir}"]
    env = cli_env(NANOVERL_TEST_PIDS=str(pids))
    proc = run_cli(*args, "reward.on_error=zero", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = read_metrics(run_dir)
    assert [m["reward/errors"] for m in metrics] == [0, 4, 0]                # the whole batch: 2 prompts x 2
    kind = {"segv": "reward/crashes", "hang": "reward/timeouts"}[fault]
    assert [m[kind] for m in metrics] == [0, 4, 0] and metrics[2]["reward/mean"] == 1.0
    written = error_rows(run_dir)
    assert len(written) == 4 and all("the batched call of 4 rows" in r["message"] for r in written)
    assert {"segv": "killed by SIGKILL", "hang": "timed out after 4s"}[fault] in written[0]["message"]
    steps_1_and_3 = [line.split() for line in pids.read_text().splitlines()]
    assert len(steps_1_and_3) == 2 and steps_1_and_3[0][0] != steps_1_and_3[1][0]  # a fresh worker after the failure
    assert all(parent != str(os.getpid()) for _, parent in steps_1_and_3)        # a child of the trainer, not the trainer

    shutil.rmtree(run_dir)
    proc = run_cli(*args, "reward.on_error=raise", env=env, timeout=300)
    assert_user_error(proc, "on data row 2", "the batched call of 4 rows", "reward.on_error=zero")
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_000001"]


def test_each_step_logs_the_peak_memory_of_the_trainer_and_its_worker_processes(tmp_path):
    """perf/peak_rss_mib is the trainer's peak during the step, perf/children_peak_rss_mib the sum of its
    children's: two reward workers that each hold 150 MiB are counted in it, every step. Each worker touches
    its 150 MiB as it loads the reward, and a call waits until both have loaded (workers start lazily: the
    first one ready could otherwise score the whole step while the other is still importing). The trainer
    loads the reward file too, to check its signature: its pid does not count."""
    reward, started = tmp_path / "holding.py", tmp_path / "started"
    started.mkdir()
    reward.write_text(
        "import os, time\n"
        "HELD = bytearray(150 * 2**20)\n"
        "HELD[::4096] = b'1' * len(HELD[::4096])  # touched: resident\n"
        f"STARTED = {str(started)!r}\n"
        "open(os.path.join(STARTED, str(os.getpid())), 'w').close()\n\n"
        "def compute_score(prompt, response, sample):\n"
        "    deadline = time.monotonic() + 30\n"
        "    while len(set(os.listdir(STARTED)) - {str(os.getppid())}) < 2 and time.monotonic() < deadline:\n"
        "        time.sleep(0.01)\n"
        "    return 1.0\n")
    run = tmp_path / "run"
    proc = run_cli("--config", REINFORCE, *BASE, "trainer.total_steps=2", "trainer.save_every=0", "data.val_files=[]",
                   "reward.memory_limit_mb=1000", "reward.timeout_s=30", f"reward.file={reward}",
                   f"trainer.output_dir={run}")     # a call may wait for the other worker to load
    assert proc.returncode == 0, proc.stderr[-3000:]
    for row in read_metrics(run):
        assert row["perf/children"] >= 2 and row["reward/errors"] == 0, row
        assert row["perf/children_peak_rss_mib"] >= 2 * 150, row
        assert row["perf/peak_rss_mib"] >= row["perf/rss_mib"] > 0, row


def test_after_a_step_the_heaps_free_pages_go_back_to_the_os():
    """release_free_heap (the trainer calls it at each step's end) returns what glibc keeps of freed chunks:
    200 MiB freed between live allocations stays resident until then (free() trims only the heap's top)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's malloc_trim")
    script = (
        "from nanoverl_core.processes import release_free_heap, resident_mib\n"
        "chunks, keep = [], []\n"
        "for _ in range(3500):\n"                                          # 60 kB: below the mmap threshold,
        "    chunks.append(bytearray(60000)); keep.append(bytearray(1000))\n"   # between live (malloc'd) ones
        "before = resident_mib(); del chunks\n"
        "freed = resident_mib(); release_free_heap(); trimmed = resident_mib()\n"
        "print(before, freed, trimmed)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    before, freed, trimmed = map(float, proc.stdout.split())
    assert freed > before - 50, (before, freed, trimmed)                # free() kept most of the 200 MiB
    assert trimmed < freed - 150, (before, freed, trimmed)              # malloc_trim gave it back


def test_validation_and_checkpoints_hand_their_freed_heap_back_before_the_next_step(tmp_path, monkeypatch):
    """What validation's generate calls and a checkpoint's writing freed goes back to the OS as soon as they
    end, as the update's does at each step's end: the next step, and the final eval, do not sit on it."""
    from nanoverl_core import load_config, load_registry
    from nanoverl_core.trainer import trainer as trainer_module

    events: list[str] = []

    def recorded(name, fn):
        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            events.append(name)
            return out
        return call

    monkeypatch.setattr(trainer_module, "release_free_heap", lambda: events.append("trim"))
    monkeypatch.setattr(trainer_module, "validate", recorded("validate", trainer_module.validate))
    monkeypatch.setattr(trainer_module.Trainer, "save", recorded("save", trainer_module.Trainer.save))
    registry = load_registry()
    config = load_config(REINFORCE, [*BASE, "trainer.total_steps=2", "trainer.val_every=1", "reward.workers=1",
                                     f"trainer.output_dir={tmp_path}"], registry=registry)
    trainer_module.Trainer(config, registry).fit()
    assert events == ["trim", "validate", "trim", "save", "trim"] * 2, events
