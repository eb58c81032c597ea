"""How users start the fsdp worker: registered under `fsdp`, launchable with torchrun on the console script."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from conftest import EXAMPLE, read_metrics, run, torchrun

from nanoverl_core import load_config, load_registry


def test_plugin_registers_the_fsdp_worker_lazily():
    """Listing plugins names the worker without importing torch or the worker module."""
    code = ("import sys; from nanoverl_core import load_registry; e = load_registry().entry('worker', 'fsdp'); "
            "print(e.provider, e.obj, 'torch' in sys.modules, 'nanoverl_fsdp.workers' in sys.modules)")
    out = run([sys.executable, "-c", code]).stdout.split()
    assert out == ["nanoverl-fsdp", "nanoverl_fsdp.workers:make_workers", "False", "False"]


def test_the_example_config_resolves_to_the_fsdp_worker():
    config = load_config(EXAMPLE, registry=load_registry())
    assert config.worker.name == "fsdp" and config.rollout.name == "hf"
    assert (config.actor_mini_batch_size * config.rollout.n // 2) % config.actor.micro_batch_size == 0


def test_torchrun_runs_the_nanoverl_train_console_script(tmp_path):
    """`torchrun ... $(which nanoverl-train) --config ...` works: torchrun runs the script with python."""
    script = Path(sys.executable).with_name("nanoverl-train")
    script = script if script.is_file() else Path(shutil.which("nanoverl-train"))
    out = tmp_path / "run"
    run(torchrun(2, str(script), "--config", str(EXAMPLE), "trainer.total_steps=1", "trainer.val_every=0",
                 "data.batch_size=2", "rollout.n=4", "actor.micro_batch_size=4", f"trainer.output_dir={out}"),
        timeout=120)
    metrics = read_metrics(out)
    assert list(metrics) == [1] and 0 <= metrics[1]["reward/mean"] <= 1
    actor = out / "checkpoints" / "step_000001" / "actor"
    assert {p.name for p in actor.glob("*_rank*")} == {"model_rank0.safetensors", "model_rank1.safetensors",
                                                       "optimizer_rank0.pt", "optimizer_rank1.pt"}
