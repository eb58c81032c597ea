"""The wandb tracker through `nanoverl-train` in a subprocess, offline, as a user runs it, read back with
W&B's own reader of the transaction log (`wandb leet inspect --json`, wandb-core's parser): every metric
under its trainer key once per step, also across the folders of a killed and a resumed process, which
share one W&B run; the config; the exit code (a failed run is 1); the wandb-core service process ends
with the run; a bad setting and a missing wandb package each exit 2 with one line."""

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

pytest.importorskip("wandb")
from nanoverl_core.testing import MACHINE_METRICS, assert_user_error  # noqa: E402
from nanoverl_wandb.tracker import last_logged_step  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
REINFORCE = str(ROOT / "examples" / "configs" / "debug_reinforce.toml")
SHORT = ["trainer.progress=none", "data.batch_size=4", "rollout.n=4"]
WALL_CLOCK = MACHINE_METRICS
"""Metrics that differ between a step and its replay after a resume (everything else is exact)."""


@pytest.fixture(autouse=True)
def _wandb_home(tmp_path, monkeypatch):
    """wandb's cache, staging (tables) and settings folders in the test's tmp folder, not the user's home."""
    for key in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.setenv(key, str(tmp_path / "wandb-home" / key.lower()))


def cli_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1", **extra}
    for key in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_DIR"):
        if key not in extra:
            env.pop(key, None)
    return env


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "nanoverl_core.cli", *args]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cli(*args), cwd=ROOT, env=env or cli_env(), capture_output=True, text=True, timeout=300)




def numeric_history(run_dir: Path) -> dict[int, dict[str, float]]:
    """metrics.jsonl as {step: {key: value}}, numbers only (what a tracker logs as a metric)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: {k: float(v) for k, v in row.items()
                          if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)} for row in rows}


def run_folders(run_dir: Path) -> list[Path]:
    """The W&B run folders in the order the processes started them (their names start with the time)."""
    return sorted((run_dir / "wandb").glob("offline-run-*"), key=lambda p: p.name)


def records(folder: Path) -> list[dict]:
    """The folder's .wandb transaction log through W&B's own reader, one dict per record."""
    (log,) = folder.glob("run-*.wandb")
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
                         capture_output=True, text=True, timeout=120, env=cli_env())
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def history(recs: list[dict]) -> dict[int, dict]:
    """{step: history item}, asserting each step has one history row."""
    rows = [r["history"] for r in recs if r["type"] == "history"]
    steps = [int(row["step"]["num"]) for row in rows]
    assert len(steps) == len(set(steps)), steps
    return {step: row["item"] for step, row in zip(steps, rows)}


def exit_code(recs: list[dict]) -> int | None:
    codes = [r["exit"].get("exit_code", 0) for r in recs if r["type"] == "exit"]
    return codes[-1] if codes else None


def assert_metrics_match(logged: dict[int, dict], want: dict[int, dict[str, float]], exact_steps=()) -> None:
    """Each step's W&B row holds every numeric metrics.jsonl key of that step under the same name and value
    (wall-clock metrics only at `exact_steps`, the steps logged by the process whose metrics.jsonl this is)."""
    assert sorted(logged) == sorted(want)
    for step, metrics in want.items():
        row = logged[step]
        assert set(metrics) <= set(row), set(metrics) - set(row)
        assert {k for k in row if not k.startswith(("_", "samples/"))} == set(metrics)
        for key, value in metrics.items():
            if key.startswith(WALL_CLOCK) and step not in exact_steps:
                continue
            got = float(row[key])
            assert (math.isnan(got) and math.isnan(value)) or got == pytest.approx(value, rel=1e-12), (step, key)


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            child = int(stat.parent.name)
            out += [child, *_children(child)]
    return out


def wandb_service(pid: int, timeout: float = 60) -> int:
    """The pid of the wandb-core process the trainer `pid` started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in _children(pid):
            try:
                if b"wandb-core" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return child
            except OSError:
                pass
        time.sleep(0.05)
    pytest.fail("no wandb-core process under the trainer")


def assert_ends(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state == "Z":  # ended, not yet reaped by its (re)parent
            return
        time.sleep(0.1)
    pytest.fail(f"wandb-core ({pid}) still runs {timeout} s after the trainer ended")


def test_a_run_logs_every_metric_once_per_step_with_its_config_and_ends_its_service(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(cli("--config", REINFORCE, *SHORT, "trainer.total_steps=4", "trainer.val_every=2",
                                f"trainer.output_dir={run_dir}", "tracking.trackers=[console,wandb,jsonl]",
                                "tracking.wandb.project=nanoverl-test", "tracking.wandb.tags=[smoke,debug]"),
                            cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    service = wandb_service(proc.pid)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert_ends(service, timeout=10)
    assert "wandb: nanoverl logging run 'run' (" in stdout and "mode offline" in stdout

    (folder,) = run_folders(run_dir)
    recs = records(folder)
    (run,) = [r["run"] for r in recs if r["type"] == "run"]
    assert run["project"] == "nanoverl-test" and run["display_name"] == "run" and run["tags"] == ["smoke", "debug"]
    config = run["config"]["update"]
    assert config["trainer"]["total_steps"] == 4 and config["actor"]["lr"] == 1e-3
    assert config["nanoverl"]["run_dir"] == str(run_dir.resolve()) and "nanoverl-wandb" in config["nanoverl"]["plugins"]
    logged = history(recs)
    assert_metrics_match(logged, numeric_history(run_dir), exact_steps=range(1, 5))
    assert [s for s in logged if "val/reward/mean" in logged[s]] == [2, 4]
    assert all(logged[s]["samples/rollouts._type"] == "table-file" and logged[s]["samples/rollouts.nrows"] == 8
               for s in logged)                                          # trainer.rollout_samples = 8 rows
    assert [s for s in logged if "samples/val._type" in logged[s]] == [2, 4]
    assert exit_code(recs) == 0


def test_a_killed_and_resumed_run_is_one_wandb_run_with_each_step_once(tmp_path):
    run_dir = tmp_path / "run"
    args = ["--config", REINFORCE, *SHORT, "trainer.total_steps=8", "trainer.save_every=3", "trainer.val_every=4",
            f"trainer.output_dir={run_dir}", "tracking.trackers=[jsonl,wandb]"]
    proc = subprocess.Popen(cli(*args), cwd=ROOT, env=cli_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    service = wandb_service(proc.pid)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:  # kill once W&B holds step 4, past the step-3 checkpoint
        if last_logged_step(run_dir / "wandb", "*") >= 4:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert_ends(service, timeout=30)  # the service notices its parent is gone
    (first,) = run_folders(run_dir)
    killed = records(first)
    before = history(killed)
    assert exit_code(killed) is None and min(before) == 1 and 4 <= max(before) < 8, sorted(before)

    resumed = run_cli(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr
    assert "wandb: nanoverl continuing run 'run' (" in resumed.stdout
    assert f"after step {max(before)}" in resumed.stdout

    folders = run_folders(run_dir)
    assert len(folders) == 2 and folders[0] == first
    later = records(folders[1])
    (run_a,), (run_b,) = ([r["run"]["run_id"] for r in recs if r["type"] == "run"] for recs in (killed, later))
    assert run_a == run_b and first.name.endswith(run_a) and folders[1].name.endswith(run_a)  # one W&B run
    after = history(later)
    assert min(after) == max(before) + 1 and max(after) == 8        # the replayed steps W&B had are not sent again
    assert not set(before) & set(after)
    assert_metrics_match({**before, **after}, numeric_history(run_dir), exact_steps=after)
    assert exit_code(later) == 0


def test_a_failed_run_finishes_its_wandb_run_with_exit_code_1(tmp_path):
    """A reward that raises in step 1 stops the run (exit 2, one line) after the trackers started; a start
    that fails earlier (a malformed data row) leaves no run directory at all, W&B's offline files included."""
    reward = tmp_path / "raises.py"
    reward.write_text("def compute_score(prompt, response, sample):\n    raise ValueError('no')\n")
    run_dir = tmp_path / "run"
    proc = run_cli("--config", REINFORCE, *SHORT, f"trainer.output_dir={run_dir}", f"reward.file={reward}",
                   "reward.on_error=raise", "tracking.trackers=[wandb]")
    assert_user_error(proc, "raised ValueError: no")
    (folder,) = run_folders(run_dir)
    recs = records(folder)
    assert exit_code(recs) == 1 and not history(recs)

    data = tmp_path / "bad.jsonl"
    data.write_text('{"question": "abc"}\n')
    proc = run_cli("--config", REINFORCE, *SHORT, f"trainer.output_dir={tmp_path / 'early'}",
                   f"data.train_files=[{data}]", "tracking.trackers=[wandb]")
    assert_user_error(proc, str(data))
    assert not (tmp_path / "early").exists()


def test_a_bad_setting_exits_2_with_one_line(tmp_path):
    base = ["--config", REINFORCE, "--dry-run", f"trainer.output_dir={tmp_path / 'run'}",
            "tracking.trackers=[console,wandb]"]
    assert_user_error(run_cli(*base, "tracking.wandb.mode=onlin"), "tracking.wandb.mode", "onlin")
    assert_user_error(run_cli(*base, "tracking.wandb.projet=x"), "projet", "project")
    assert_user_error(run_cli(*base, "tracking.wandb.max_sample_rows=-1"), "max_sample_rows")
    ok = run_cli(*base, "tracking.wandb.mode=disabled", "tracking.wandb.tags=[a,b]")
    assert ok.returncode == 0, ok.stderr
    assert '"mode": "disabled"' in ok.stdout
    assert not (tmp_path / "run").exists()


def test_without_the_wandb_package_choosing_the_tracker_names_the_install(tmp_path):
    """A `wandb` package that fails to import, first on the path, stands for one not installed."""
    blocker = tmp_path / "blocked" / "wandb"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError(\"No module named 'wandb'\")\n")
    proc = run_cli("--config", REINFORCE, "--dry-run", f"trainer.output_dir={tmp_path / 'run'}",
                   "tracking.trackers=[console,wandb]", env=cli_env(PYTHONPATH=str(blocker.parent)))
    assert_user_error(proc, "tracker 'wandb' from nanoverl-wandb cannot be imported", "No module named 'wandb'",
                      'pip install "nanoverl[wandb]"', "plugins/nanoverl-wandb")


def test_a_checkpoint_returns_once_its_steps_are_in_the_wandb_file_and_a_resume_drops_them(tmp_path, monkeypatch):
    """state_dict() (the trainer calls it to write a checkpoint) waits for wandb-core, which writes the .wandb
    file asynchronously: a kill right after the checkpoint must not lose the steps it covers."""
    from nanoverl_core import load_config, load_registry
    from nanoverl_wandb.tracker import last_step_in, make_tracker

    for key in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_DIR", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(key, raising=False)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = load_config(REINFORCE, [f"trainer.output_dir={run_dir}", "tracking.trackers=[wandb]",
                                     "tracking.wandb.project=barrier"], registry=load_registry())
    tracker = make_tracker(config, run_dir, None)
    try:
        for step in (1, 2, 3):
            tracker.log_metrics({"reward/mean": step / 10, "note": "not a number"}, step)
        state = tracker.state_dict()
        first = Path(tracker.run.settings.sync_file)
        assert last_step_in(first)[0] == 3  # on disk when the checkpoint would be written, not seconds later
    finally:
        tracker.close(True)
    resumed = make_tracker(config, run_dir, state)  # as if the checkpoint were at step 1: steps 2, 3 replay
    try:
        for step in (2, 3, 4):
            resumed.log_metrics({"reward/mean": step}, step)
        second = Path(resumed.run.settings.sync_file)
    finally:
        resumed.close(False)
    assert state == {"run_id": resumed.run_id} and second != first
    assert sorted(history(records(first.parent))) == [1, 2, 3]
    later = records(second.parent)
    assert {step: row["reward/mean"] for step, row in history(later).items()} == {4: 4}
    assert exit_code(later) == 1


def test_online_without_a_login_exits_2_with_one_line_before_training(tmp_path):
    """$WANDB_MODE is followed when [tracking.wandb] mode is empty; no API key (a fresh HOME, none in the
    environment) stops the run before any model loads."""
    env = cli_env(WANDB_MODE="online", HOME=str(tmp_path / "home"))
    env.pop("WANDB_API_KEY", None)
    proc = run_cli("--config", REINFORCE, *SHORT, "trainer.total_steps=2", f"trainer.output_dir={tmp_path / 'run'}",
                   "tracking.trackers=[console,wandb]", env=env)
    assert_user_error(proc, "wandb could not start run", "mode 'online'", "wandb login", 'mode = "offline"')
    assert not (tmp_path / "run" / "metrics.jsonl").exists() and not (tmp_path / "run" / "checkpoints").exists()
