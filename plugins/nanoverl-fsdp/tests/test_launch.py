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


def test_compute_dtype_and_a_different_param_dtype_exit_2_with_one_line_naming_both(tmp_path):
    """Both keys choose the dtype forward / backward run in: set alike (or one of them) they are accepted,
    set differently the run stops before anything is written."""
    from nanoverl_core.testing import assert_user_error
    from nanoverl_fsdp.settings import check_precision

    for compute, param in (("bfloat16", "float32"), ("bfloat16", "bfloat16"), ("", "bfloat16"), ("", "float16")):
        check_precision(load_config(EXAMPLE, [f"model.compute_dtype={compute}", f"worker.fsdp.param_dtype={param}"],
                                    registry=load_registry()))
    out = tmp_path / "run"
    proc = run([sys.executable, "-m", "nanoverl_core.cli", "--config", str(EXAMPLE), "model.compute_dtype=bfloat16",
                "worker.fsdp.param_dtype=float16", f"trainer.output_dir={out}"], check=False)
    assert_user_error(proc, "model.compute_dtype = 'bfloat16'", "worker.fsdp.param_dtype = 'float16'")
    assert not out.exists()
