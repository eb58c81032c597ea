"""A training run killed with SIGKILL and resumed is one MLflow run with each step exactly once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from conftest import EXAMPLES, ROOT, cli_env, read_metrics, run_cli

pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402


def test_killed_and_resumed_run_is_one_mlflow_run_with_each_step_once(tmp_path):
    run_dir, uri = tmp_path / "run", f"sqlite:///{tmp_path}/mlflow.db"
    args = ["--config", str(EXAMPLES / "debug_reinforce.toml"), "trainer.progress=none", "trainer.total_steps=8",
            "trainer.save_every=3", "trainer.val_every=4", f"trainer.output_dir={run_dir}",
            "tracking.trackers=[jsonl,mlflow]", f"tracking.mlflow.uri={uri}", "tracking.mlflow.experiment=resume-test"]
    env = cli_env(MLFLOW_TRACKING_URI="")
    proc = subprocess.Popen([sys.executable, "-m", "nanoverl_core.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:  # kill after step 4, past the step-3 checkpoint
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 4:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    resumed = run_cli(*args, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("resume-test")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    history = client.get_metric_history(runs[0].info.run_id, "reward/mean")
    assert sorted(m.step for m in history) == list(range(1, 9))
    jsonl = {row["step"]: row["reward/mean"] for row in read_metrics(run_dir)}
    assert {m.step: m.value for m in history} == pytest.approx(jsonl)
    val = client.get_metric_history(runs[0].info.run_id, "val/reward/mean")
    assert sorted(m.step for m in val) == [4, 8]

