"""The mlflow tracker as a user selects it, through `nanoverl-train`: reward components' metrics in a real
store, a store URI that mlflow does not serve is one `error:` line, its settings are typed text."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES, read_metrics, run_cli

pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402


LENGTH = ("def compute_score(prompt, response, sample):\n"
          "    return {'score': len(response) / 4, 'chars': float(len(response))}\n")


def test_each_reward_component_and_its_extra_keys_are_metrics_in_the_store(tmp_path):
    """[[reward.components]]: reward/<name>/mean and a component's extra keys land in MLflow at every step, as
    in metrics.jsonl."""
    (tmp_path / "length.py").write_text(LENGTH)
    config = tmp_path / "weighted.toml"
    config.write_text((EXAMPLES / "debug_reinforce.toml").read_text().replace('[reward]\nname = "char_match"\n', "")
                      + f'\n[reward]\nworkers = 2\n\n[[reward.components]]\nname = "char_match"\nweight = 0.7\n\n'
                      f'[[reward.components]]\nfile = "{tmp_path / "length.py"}"\nweight = 0.3\n')
    run_dir, store = tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_cli("--config", str(config), "trainer.total_steps=2", "trainer.save_every=0", "data.val_files=[]",
                   "data.batch_size=4", "rollout.n=2", "trainer.progress=none", "tracking.trackers=[jsonl,mlflow]",
                   f"tracking.mlflow.uri={store}", f"trainer.output_dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = read_metrics(run_dir)
    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("nanoverl").experiment_id])
    for key in ("reward/char_match/mean", "reward/length/mean", "reward/length/chars"):
        logged = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert logged == [(r["step"], pytest.approx(r[key])) for r in metrics], key


def test_a_store_uri_with_a_scheme_mlflow_does_not_serve_is_one_line_naming_the_closest(tmp_path):
    proc = run_cli("--config", str(EXAMPLES / "debug_reinforce.toml"), "--dry-run", "tracking.trackers=[mlflow]",
                   "tracking.mlflow.uri=fiel:///tmp/store", f"trainer.output_dir={tmp_path / 'run'}")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert all(needle in errors[0] for needle in ("'tracking.mlflow.uri'", "'fiel'", "did you mean 'file'?"))


def test_the_typed_settings_stay_text_as_written(tmp_path):
    from nanoverl_core import load_config

    cfg = load_config(EXAMPLES / "debug_reinforce.toml", ["tracking.trackers=[mlflow]", "tracking.mlflow.run_name=007",
                                                         "tracking.mlflow.experiment=2024-01-01"])
    assert cfg.tracking.settings["mlflow"].run_name == "007"            # text as written, not the int 7
    assert cfg.tracking.settings["mlflow"].experiment == "2024-01-01"   # nor a YAML date
