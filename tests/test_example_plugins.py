"""The example plugins in examples/plugins/, installed with real pip and used by name.

Each package is copied to a tmp folder (so the in-tree build leaves nothing behind) and installed
with `pip install --no-deps --target`; the CLI runs in a subprocess with that folder on PYTHONPATH,
where entry points are discovered from the installed dist-info as after a normal `pip install`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import EXAMPLES, GSM8K, ROOT, cli_env, read_metrics, run_cli

PLUGINS = ROOT / "examples" / "plugins"
DEBUG = str(EXAMPLES / "debug_reinforce.toml")
EXPECTED = {  # distribution -> (its hooks, the names it registers)
    "nanoverl-math-reward": (["register_rewards"], {"reward": ["math_answer", "math_answer_strict"]}),
    "nanoverl-batch-baseline": (["register_advantage_estimators"], {"advantage_estimator": ["batch_mean_baseline"]}),
}

# Measured (seed 0, CPU, 100 steps of debug_reinforce.toml, ~35 s): greedy val/reward/mean 0.32 at
# step 50 and 1.0 at step 100; train reward/mean 0.04 over the first 10 steps, 0.92 over the last 10.
# Greedy val climbs steeply (~0.15 at step 40, ~0.6-0.75 at 70): a run perturbed like another CPU's
# rounding (lr off by 0.1-5%) lands 0.74-1.0 at step 80, too close to 0.7, and 1.0 at step 100.
STEPS, MIN_FINAL_VAL = 100, 0.7


def pip_install_target(package: Path, tmp: Path) -> Path:
    """Install `package` with pip into a private folder and return that folder."""
    source, site = tmp / "src" / package.name, tmp / "site" / package.name
    shutil.copytree(package, source,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--disable-pip-version-check", "--target", str(site), str(source)],
                   check=True, capture_output=True, text=True)
    return site


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("example-plugins")
    sites = [pip_install_target(PLUGINS / dist, tmp) for dist in EXPECTED]
    return cli_env(PYTHONPATH=os.pathsep.join(map(str, sites)))


def test_both_example_plugins_are_listed_with_versions_hooks_and_names(env):
    proc = run_cli("plugins", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    listed = {p["dist"]: p for p in json.loads(proc.stdout)}
    for dist, (hooks, names) in EXPECTED.items():
        assert listed[dist]["version"] == "0.1.0"
        assert listed[dist]["hooks"] == hooks
        assert listed[dist]["names"] == names
        assert listed[dist]["error"] == ""


def test_math_answer_and_the_estimator_resolve_by_name_in_a_dry_run(env):
    proc = run_cli("--config", DEBUG, "--dry-run", "reward.name=math_answer",
                   "algorithm.advantage_estimator=batch_mean_baseline", env=env)
    assert proc.returncode == 0, proc.stderr
    providers = {p["kind"]: p["provider"] for p in json.loads(proc.stdout)["plugins"]}
    assert providers["reward"] == "nanoverl-math-reward"
    assert providers["advantage_estimator"] == "nanoverl-batch-baseline"


def test_math_answer_scores_a_debug_run_and_logs_its_extra_keys(env, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("--config", DEBUG, "reward.name=math_answer", "trainer.total_steps=2", "trainer.val_every=0",
                   "trainer.save_every=0", "tracking.trackers=[jsonl]", f"trainer.output_dir={run_dir}", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for m in read_metrics(run_dir):  # the copy task's targets are bare numbers: found, never formatted
        assert m["reward/format_ok"] == 0.0 and 0 < m["reward/answer_found"] <= 1 and m["reward/errors"] == 0


def test_a_misspelt_estimator_name_suggests_the_installed_one(env):
    proc = run_cli("--config", DEBUG, "--dry-run", "algorithm.advantage_estimator=batch_mean_baselin", env=env)
    assert proc.returncode == 2
    assert "did you mean 'batch_mean_baseline'" in proc.stderr and "Traceback" not in proc.stderr


def test_installed_math_answer_scores_real_gsm8k_rows(env):
    data = GSM8K / "test.parquet"
    if not data.is_file():
        pytest.skip(f"GSM8K data not found at {data}")
    script = textwrap.dedent(f"""
        import json, pyarrow.parquet as pq
        from nanoverl_core import load_registry
        fn = load_registry().get("reward", "math_answer")
        rows = pq.read_table({str(data)!r}).slice(0, 50).to_pylist()
        right = [fn("", r["extra_info"]["answer"], r)["score"] for r in rows]
        wrong = [fn("", r["extra_info"]["answer"] + "0", r)["score"] for r in rows]
        print(json.dumps([right, wrong, fn.__module__]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    right, wrong, module = json.loads(proc.stdout)
    assert right == [1.0] * 50 and wrong == [0.0] * 50  # "#### 18" + "0" reads 180
    assert module == "nanoverl_math_reward.rewards"


def test_batch_mean_baseline_trains_the_debug_task_end_to_end(env, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("--config", DEBUG, "algorithm.advantage_estimator=batch_mean_baseline",
                   f"trainer.total_steps={STEPS}", f"trainer.val_every={STEPS // 2}", "trainer.save_every=0",
                   "tracking.trackers=[jsonl]", f"trainer.output_dir={run_dir}", env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = read_metrics(run_dir)
    assert len(metrics) == STEPS
    rewards = [m["reward/mean"] for m in metrics]
    assert sum(rewards[-10:]) / 10 > sum(rewards[:10]) / 10 + 0.3, rewards
    assert metrics[-1]["val/reward/mean"] >= MIN_FINAL_VAL, metrics[-1]
    resolved = json.loads((run_dir / "config.json").read_text())
    assert resolved["config"]["algorithm"]["advantage_estimator"] == "batch_mean_baseline"
    assert resolved["plugins"]["nanoverl-batch-baseline"] == "0.1.0"
