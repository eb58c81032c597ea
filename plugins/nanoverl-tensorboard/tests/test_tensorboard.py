"""The tensorboard tracker through `nanoverl-train` in a subprocess, as a user runs it, read back with
TensorBoard's own reader (EventAccumulator): every metric under its trainer key once per step, also after
a SIGKILL and a resume; a bad setting and a missing tensorboard package each exit 2 with one line."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader  # noqa: E402

from nanoverl_core.testing import assert_user_error  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
REINFORCE = str(ROOT / "examples" / "configs" / "debug_reinforce.toml")
SHORT = ["trainer.progress=none", "data.batch_size=4", "rollout.n=4"]


def cli_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1", **extra}


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanoverl_core.cli", *args], cwd=ROOT, env=env or cli_env(),
                          capture_output=True, text=True, timeout=300)




def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def numeric_history(run_dir: Path) -> dict[str, dict[int, float]]:
    """metrics.jsonl as {key: {step: value}}, numbers only (what a tracker logs as a scalar)."""
    history: dict[str, dict[int, float]] = {}
    for row in read_metrics(run_dir):
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                history.setdefault(key, {})[row["step"]] = float(value)
    return history


def read_scalars(log_dir: Path) -> tuple[EventAccumulator, dict[str, list[tuple[int, float]]]]:
    """The folder as TensorBoard reads it: {tag: [(step, value), ...]} in file order, purges applied."""
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc, {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def raw_steps(event_file: Path, tag: str) -> list[int]:
    """Steps of `tag` in one event file as written, before any purge."""
    return [event.step for event in EventFileLoader(str(event_file)).Load()
            for value in event.summary.value if value.tag == tag]


def assert_matches_jsonl(scalars: dict[str, list[tuple[int, float]]], run_dir: Path) -> None:
    """Every numeric metrics.jsonl key is a tag of the same name, with every step once and the same value
    (float32 in the event file)."""
    history = numeric_history(run_dir)
    assert set(scalars) == set(history), set(scalars) ^ set(history)
    for tag, points in scalars.items():
        steps = [step for step, _ in points]
        assert steps == sorted(history[tag]), (tag, steps)
        for step, value in points:
            want = history[tag][step]
            assert (math.isnan(value) and math.isnan(want)) or value == pytest.approx(want, rel=1e-6, abs=1e-30), \
                (tag, step, value, want)


def test_a_run_logs_every_metric_under_its_trainer_key_once_per_step(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("--config", REINFORCE, *SHORT, "trainer.total_steps=4", "trainer.val_every=2",
                   f"trainer.output_dir={run_dir}", "tracking.trackers=[console,tensorboard,jsonl]")
    assert proc.returncode == 0, proc.stderr
    assert f"tensorboard: writing {run_dir / 'tensorboard'}; browse: tensorboard --logdir" in proc.stdout
    acc, scalars = read_scalars(run_dir / "tensorboard")
    assert_matches_jsonl(scalars, run_dir)
    assert [s for s, _ in scalars["reward/mean"]] == [1, 2, 3, 4]
    assert [s for s, _ in scalars["val/reward/mean"]] == [2, 4]
    assert {"actor/pg_loss", "actor/entropy", "timing/step", "rollout/response_length/mean"} <= set(scalars)

    texts = acc.Tags()["tensors"]  # text summaries are tensors of the text plugin
    assert {"config/text_summary", "samples/rollouts/text_summary", "samples/val/text_summary"} <= set(texts)
    rollouts = acc.Tensors("samples/rollouts/text_summary")
    assert [e.step for e in rollouts] == [1, 2, 3, 4]
    table = rollouts[0].tensor_proto.string_val[0].decode()
    assert table.splitlines()[0] == "| uid | prompt | response | score | advantage |"
    assert len(table.splitlines()) == 2 + 8  # header, rule, rollout_samples = 8 rows (under max_sample_rows)
    config = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert json.loads("\n".join(line[4:] for line in config.splitlines()))["config"]["trainer"]["total_steps"] == 4


def test_a_killed_and_resumed_run_reads_back_each_step_once(tmp_path):
    run_dir = tmp_path / "run"
    log_dir = run_dir / "tensorboard"
    args = ["--config", REINFORCE, *SHORT, "trainer.total_steps=8", "trainer.save_every=3", "trainer.val_every=4",
            f"trainer.output_dir={run_dir}", "tracking.trackers=[tensorboard,jsonl]",
            "tracking.tensorboard.flush_secs=0"]  # flushed each step, before jsonl writes its line
    proc = subprocess.Popen([sys.executable, "-m", "nanoverl_core.cli", *args], cwd=ROOT, env=cli_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:  # kill after step 4, past the step-3 checkpoint
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 4:
            break
        time.sleep(0.02)
    assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (killed,) = log_dir.glob("events.out.tfevents.*")
    before = raw_steps(killed, "reward/mean")
    assert before[:4] == [1, 2, 3, 4] and before[-1] < 8, before  # steps 4.. are written and will be replayed

    resumed = run_cli(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr and "tensorboard: continuing" in resumed.stdout

    files = sorted(log_dir.glob("events.out.tfevents.*"))
    assert len(files) == 2 and files[0] == killed
    assert raw_steps(files[1], "reward/mean") == [4, 5, 6, 7, 8]  # the replay, after SessionLog.START at 4
    _, scalars = read_scalars(log_dir)
    assert [s for s, _ in scalars["reward/mean"]] == list(range(1, 9))
    assert [s for s, _ in scalars["val/reward/mean"]] == [4, 8]
    assert_matches_jsonl(scalars, run_dir)  # the resumed values (jsonl drops the killed process's replayed lines)


def test_a_bad_setting_exits_2_with_one_line(tmp_path):
    base = ["--config", REINFORCE, "--dry-run", f"trainer.output_dir={tmp_path / 'run'}",
            "tracking.trackers=[console,tensorboard]"]
    assert_user_error(run_cli(*base, "tracking.tensorboard.flush_secs=-1"), "tracking.tensorboard.flush_secs")
    assert_user_error(run_cli(*base, "tracking.tensorboard.logdir=tb"), "logdir", "log_dir")
    assert_user_error(run_cli(*base, "tracking.tensorboard.max_sample_rows=many"), "max_sample_rows")
    ok = run_cli(*base, "tracking.tensorboard.flush_secs=0")
    assert ok.returncode == 0, ok.stderr
    assert '"flush_secs": 0' in ok.stdout


def test_without_the_tensorboard_package_choosing_the_tracker_names_the_install(tmp_path):
    """A `tensorboard` package that fails to import, first on the path, stands for one not installed."""
    blocker = tmp_path / "blocked" / "tensorboard"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError(\"No module named 'tensorboard'\")\n")
    proc = run_cli("--config", REINFORCE, "--dry-run", f"trainer.output_dir={tmp_path / 'run'}",
                   "tracking.trackers=[console,tensorboard]", env=cli_env(PYTHONPATH=str(blocker.parent)))
    assert_user_error(proc, "tracker 'tensorboard' from nanoverl-tensorboard cannot be imported",
                      "No module named 'tensorboard'", 'pip install "nanoverl[tensorboard]"',
                      "plugins/nanoverl-tensorboard")
    assert not (tmp_path / "run").exists()
