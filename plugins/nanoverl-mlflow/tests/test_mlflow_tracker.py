"""The mlflow tracker against real MLflow stores: a local sqlite file and a `mlflow server` subprocess."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402

from nanoverl_mlflow.settings import MlflowSettings  # noqa: E402
from nanoverl_mlflow.tracker import make_tracker  # noqa: E402
from nanoverl_core.config import Config  # noqa: E402
from nanoverl_core.errors import UserError  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    """No test may reach the user's store, inherit their HTTP retry settings or write outside tmp_path."""
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """A migrated, empty sqlite store. Tests copy it into place to skip MLflow's schema migrations (seconds
    on a busy machine); the first test creates its store from nothing, as a user's first run does."""
    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


def copy_store(template: Path, db: Path) -> str:
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, db)
    return f"sqlite:///{db}"


def make_config(run_dir: Path, uri: str = "") -> Config:
    cfg = Config()
    cfg.trainer.output_dir = str(run_dir)
    cfg.tracking.trackers = ["console", "jsonl", "mlflow"]
    cfg.tracking.settings["mlflow"] = MlflowSettings(uri=uri)
    return cfg


def step_metrics(step: int) -> dict[str, float]:
    return {"reward/mean": step / 10, "actor/pg_loss": -step / 100, "timing/step": 0.5 + step}


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MlflowServer:
    """`mlflow server` on a free port with its own sqlite store; stop() and start() keep the store."""

    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120) -> None:
        cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
               "--backend-store-uri", f"sqlite:///{self.root / 'db'}", "--default-artifact-root",
               str(self.root / "art"), "--workers", "1"]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job workers: starts in ~10 s
        log = (self.root / "server.log").open("a")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"mlflow server exited:\n{(self.root / 'server.log').read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=2).read()
                return
            except OSError:
                time.sleep(0.5)
        self.stop()
        pytest.fail(f"mlflow server did not answer within {timeout_s} s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)  # the server and its uvicorn worker share our session
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        with socket.socket() as sock:  # the worker may outlive the parent for a moment
            for _ in range(40):
                if sock.connect_ex(("127.0.0.1", self.port)) != 0:
                    break
                time.sleep(0.25)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory, empty_store):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow_server"))
    copy_store(empty_store, server.root / "db")
    server.start()
    yield server
    server.stop()


# ---- local store -------------------------------------------------------------------------------------------
def test_local_store_records_every_step_params_tags_and_config(tmp_path, capsys):
    run_dir = tmp_path / "runs" / "demo"
    run_dir.mkdir(parents=True)
    cfg = make_config(run_dir)
    cfg.model.path = "x" * 7000
    written = {"config": cfg.to_dict(), "plugins": {"nanoverl": "0.1.0", "nanoverl-grpo": "0.1.0"}}
    (run_dir / "config.json").write_text(json.dumps(written))

    tracker = make_tracker(cfg, run_dir, None)
    for step in (1, 2, 3):
        tracker.log_metrics({**step_metrics(step), "reward/acc@1": 1.0}, step)
    tracker.log_metrics({"val/reward/mean": 0.75}, 3)
    tracker.log_samples("val", [{"prompt": "1+1", "response": "2", "score": 1.0}, {"prompt": "2+2", "score": 0.0}], 3)
    tracker.close(success=True)

    store = tmp_path / "runs" / "mlflow.db"  # the embedded store sits next to the run directories
    assert store.is_file()
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    run = client.get_run(tracker.state_dict()["run_id"])
    assert run.info.run_name == "demo" and run.info.status == "FINISHED"
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.name == "nanoverl" and experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert run.info.artifact_uri.startswith((tmp_path / "runs" / "mlartifacts").as_uri())

    assert history(client, run.info.run_id, "reward/mean") == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert history(client, run.info.run_id, "val/reward/mean") == [(3, 0.75)]
    assert history(client, run.info.run_id, "reward/acc_1") == [(1, 1.0), (2, 1.0), (3, 1.0)]  # '@' is rejected
    # the headline copies, MLflow only: the first section of the UI's charts (test_mlflow_ui.py)
    assert history(client, run.info.run_id, "_headline/reward_mean") == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert history(client, run.info.run_id, "_headline/val_reward_mean") == [(3, 0.75)]
    assert set(run.data.metrics) == {"reward/mean", "actor/pg_loss", "timing/step", "reward/acc_1",
                                     "val/reward/mean", "_headline/reward_mean", "_headline/val_reward_mean"}

    params = run.data.params
    assert params["actor.lr"] == "1e-06" and params["trainer.total_steps"] == "100"
    assert params["tracking.trackers"] == '["console", "jsonl", "mlflow"]'
    assert params["actor.betas"] == "[0.9, 0.999]"
    assert len(params["model.path"]) <= 6000 and params["model.path"].endswith("(truncated)")

    tags = run.data.tags
    assert tags["nanoverl.checkpoint_dir"] == str(run_dir.resolve() / "checkpoints")
    assert tags["nanoverl.plugin.nanoverl-grpo"] == "0.1.0" and tags["nanoverl.plugin.nanoverl"] == "0.1.0"

    out = tmp_path / "download"
    config_json = Path(client.download_artifacts(run.info.run_id, "config.json", str(out)))
    assert json.loads(config_json.read_text()) == written
    samples = Path(client.download_artifacts(run.info.run_id, "samples/val_step_3.json", str(out)))
    assert json.loads(samples.read_text()) == {"columns": ["prompt", "response", "score"],
                                               "data": [["1+1", "2", 1.0], ["2+2", None, 0.0]]}

    browse = f"mlflow ui --backend-store-uri sqlite:///{store} --host 127.0.0.1"
    lines = capsys.readouterr().out.splitlines()
    assert sum(browse in line for line in lines) == 2  # printed at start and at close


def test_store_from_env_run_name_from_config_and_config_without_config_json(tmp_path, monkeypatch, empty_store):
    run_dir = tmp_path / "runs" / "r1"
    uri = copy_store(empty_store, tmp_path / "store" / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # used since [tracking.mlflow] uri is empty
    cfg = make_config(run_dir)
    cfg.tracking.settings["mlflow"] = MlflowSettings(run_name="my-run", experiment="exp-a")
    tracker = make_tracker(cfg, run_dir, None)
    tracker.close(success=False)

    assert not (tmp_path / "runs" / "mlflow.db").exists()
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(tracker.state_dict()["run_id"])
    assert run.info.run_name == "my-run" and run.info.status == "FAILED"
    assert client.get_experiment(run.info.experiment_id).name == "exp-a"
    assert run.info.artifact_uri.startswith((tmp_path / "store" / "mlartifacts").as_uri())  # not ./mlruns
    config_json = Path(client.download_artifacts(run.info.run_id, "config.json", str(tmp_path / "dl")))
    assert json.loads(config_json.read_text())["config"]["tracking"]["mlflow"]["run_name"] == "my-run"


def test_an_existing_experiment_is_marked_as_training_unless_it_has_a_kind(tmp_path, empty_store):
    uri = copy_store(empty_store, tmp_path / "store" / "mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    client.create_experiment("plain")
    client.create_experiment("chosen", tags={"mlflow.experimentKind": "genai_development"})
    for name in ("plain", "chosen"):
        cfg = make_config(tmp_path / "runs" / name, uri)
        cfg.tracking.settings["mlflow"].experiment = name
        make_tracker(cfg, tmp_path / "runs" / name, None).close(success=True)
    kinds = {name: client.get_experiment_by_name(name).tags["mlflow.experimentKind"] for name in ("plain", "chosen")}
    assert kinds == {"plain": "custom_model_development", "chosen": "genai_development"}


# ---- resume -------------------------------------------------------------------------------------------------
def test_resume_continues_the_run_and_logs_each_step_once(tmp_path, capsys, empty_store):
    run_dir = tmp_path / "runs" / "demo"
    copy_store(empty_store, tmp_path / "runs" / "mlflow.db")  # the embedded store's place
    cfg = make_config(run_dir)
    first = make_tracker(cfg, run_dir, None)
    for step in range(1, 7):
        first.log_metrics(step_metrics(step), step)
        first.log_samples("rollouts", [{"step": step}], step)
        if step == 4:
            state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    # killed after step 6: no close(); the trainer resumes from the step-4 checkpoint and replays 5 and 6

    second = make_tracker(cfg, run_dir, state)
    for step in range(5, 9):
        replay = step_metrics(step)
        replay["timing/step"] += 100  # wall-clock metrics differ on a replay
        second.log_metrics(replay, step)
        second.log_samples("rollouts", [{"step": step}], step)
    second.close(success=True)

    assert second.state_dict() == state
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    run_id = state["run_id"]
    assert [r.info.run_id for r in client.search_runs([client.get_run(run_id).info.experiment_id])] == [run_id]
    assert history(client, run_id, "reward/mean") == [(s, s / 10) for s in range(1, 9)]
    assert history(client, run_id, "_headline/reward_mean") == [(s, s / 10) for s in range(1, 9)]
    assert history(client, run_id, "actor/pg_loss") == [(s, -s / 100) for s in range(1, 9)]
    # replayed steps keep their first-logged value; later steps come from the resumed process
    assert history(client, run_id, "timing/step") == [(s, 0.5 + s + (100 if s > 6 else 0)) for s in range(1, 9)]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["nanoverl.resumes"] == "1"
    samples = [f.path for f in client.list_artifacts(run_id, "samples")]
    assert samples == sorted(f"samples/rollouts_step_{s}.json" for s in range(1, 9))
    assert "continuing run 'demo'" in capsys.readouterr().out


def test_resume_without_the_run_in_the_store_starts_a_new_run(tmp_path, capsys, empty_store):
    run_dir = tmp_path / "runs" / "demo"
    copy_store(empty_store, tmp_path / "runs" / "mlflow.db")
    tracker = make_tracker(make_config(run_dir), run_dir, {"run_id": "0123456789abcdef0123456789abcdef"})
    tracker.log_metrics(step_metrics(5), 5)
    tracker.close(success=True)

    assert tracker.state_dict()["run_id"] != "0123456789abcdef0123456789abcdef"
    assert "starting a new MLflow run" in capsys.readouterr().err
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    assert history(client, tracker.state_dict()["run_id"], "reward/mean") == [(5, 0.5)]


# ---- failures -----------------------------------------------------------------------------------------------
def test_unreachable_server_at_start_is_a_quick_user_error(tmp_path, monkeypatch):
    uri = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")  # [tracking.mlflow] uri wins
    start = time.monotonic()
    with pytest.raises(UserError) as err:
        make_tracker(make_config(tmp_path / "runs" / "demo", uri=uri), tmp_path / "runs" / "demo", None)
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert "\n" not in message and uri in message and "Connection refused" in message
    assert "[tracking.mlflow] uri" in message and "tracking.trackers" in message


def test_sqlite_store_in_an_unusable_folder_is_a_user_error(tmp_path):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")  # a file where the store's folder should be (chmod would not stop root)
    uri = f"sqlite:///{blocker / 'mlflow.db'}"
    with pytest.raises(UserError, match=r"\[tracking.mlflow\] uri") as err:
        make_tracker(make_config(tmp_path / "runs" / "demo", uri=uri), tmp_path / "runs" / "demo", None)
    assert uri in str(err.value)


# ---- a real server ----------------------------------------------------------------------------------------------
def test_remote_server_serves_the_metrics_over_rest(mlflow_server, tmp_path, capsys):
    run_dir = tmp_path / "runs" / "remote"
    tracker = make_tracker(make_config(run_dir, uri=mlflow_server.url), run_dir, None)
    for step in (1, 2, 3):
        tracker.log_metrics(step_metrics(step), step)
    tracker.log_metrics({"actor/grad_norm": float("nan")}, 3)  # non-finite values travel too
    tracker.log_samples("val", [{"prompt": "p", "score": 1.0}], 3)
    tracker.close(success=True)

    run_id = tracker.state_dict()["run_id"]
    query = urllib.parse.urlencode({"run_id": run_id, "metric_key": "reward/mean"})
    with urllib.request.urlopen(f"{mlflow_server.url}/api/2.0/mlflow/metrics/get-history?{query}", timeout=10) as r:
        metrics = json.loads(r.read())["metrics"]
    assert sorted((m["step"], m["value"]) for m in metrics) == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert f"{mlflow_server.url}/#/experiments/" in capsys.readouterr().out
    client = MlflowClient(tracking_uri=mlflow_server.url)
    assert {f.path for f in client.list_artifacts(run_id)} >= {"config.json", "samples"}
    assert [(m.step, math.isnan(m.value)) for m in client.get_metric_history(run_id, "actor/grad_norm")] == [(3, True)]


def test_server_down_mid_run_warns_and_sends_the_missed_steps_later(mlflow_server, tmp_path, capsys):
    run_dir = tmp_path / "runs" / "flaky"
    tracker = make_tracker(make_config(run_dir, uri=mlflow_server.url), run_dir, None)
    tracker.retry_after_s = 0  # retry on every step instead of every 30 s
    tracker.log_metrics(step_metrics(1), 1)

    mlflow_server.stop()
    start = time.monotonic()
    tracker.log_metrics(step_metrics(2), 2)  # must not raise
    tracker.log_metrics(step_metrics(3), 3)
    assert time.monotonic() - start < 30
    err = capsys.readouterr().err
    assert err.count("could not log step") == 1 and "warning: mlflow: could not log step 2" in err
    assert "metrics.jsonl stays complete" in err and len(err.splitlines()) == 1

    mlflow_server.start()
    tracker.log_metrics(step_metrics(4), 4)
    tracker.close(success=True)
    assert "sent 3 delayed step(s)" in capsys.readouterr().err
    client = MlflowClient(tracking_uri=mlflow_server.url)
    assert history(client, tracker.state_dict()["run_id"], "reward/mean") == [(s, s / 10) for s in (1, 2, 3, 4)]
