"""Faults on the core's debug backends: SIGKILL at every point of a step and of a checkpoint save, a
disk that fills during a save, non-finite losses, a tracker that raises, a damaged checkpoint.
Each test names the guarantee it pins; docs/faults.md lists them.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import EXAMPLES, FIXTURES, ROOT, assert_user_error, cli_env, read_metrics, run_cli

PPO = str(EXAMPLES / "debug_ppo.toml")
REINFORCE = str(EXAMPLES / "debug_reinforce.toml")
STEPS = 8


def _load_soak():
    spec = importlib.util.spec_from_file_location("kill_resume_soak", ROOT / "scripts" / "kill_resume_soak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


soak = _load_soak()  # the soak script's helpers: run command, checkpoint checks, metric comparison


def ppo_args(run_dir: Path, steps: int = STEPS) -> list[str]:
    """The soak's PPO-with-critic run: a checkpoint every step, the newest two kept, validation every 4."""
    return soak.command(run_dir, steps)[3:]  # drop "python -m nanoverl_core.cli"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run every killed run must reproduce."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    proc = run_cli(*ppo_args(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def checkpoints(run_dir: Path) -> list[str]:
    root = run_dir / "checkpoints"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


# ---- SIGKILL -------------------------------------------------------------------------------------
KILL_DRIVER = '''
"""nanoverl-train that SIGKILLs itself at the point named by NANOVERL_TEST_KILL=<point>:<n> (the n-th time)."""
import os, shutil, signal, sys
from pathlib import Path

from nanoverl_core.workers import ppo as workers
from nanoverl_core.cli import main
from nanoverl_core.trainer import checkpoint, trainer  # trainer binds its own names before any patching

point, n = os.environ["NANOVERL_TEST_KILL"].split(":")
count = 0


def hit():
    global count
    count += 1
    if count == int(n):
        os.kill(os.getpid(), signal.SIGKILL)


def after(owner, name):
    original = getattr(owner, name)
    def wrapper(*args, **kwargs):
        out = original(*args, **kwargs)
        hit()
        return out
    setattr(owner, name, wrapper)


def before(owner, name):
    original = getattr(owner, name)
    def wrapper(*args, **kwargs):
        hit()
        return original(*args, **kwargs)
    setattr(owner, name, wrapper)


if point == "optimizer-step":      # mid-step: an optimizer has stepped, the step is neither logged nor saved
    after(workers._TorchWorker, "clip_and_step")
elif point == "save-half-written": # the actor is in the temporary folder, the critic not yet
    before(workers.TorchCritic, "save")
elif point == "before-rename":     # the temporary folder is complete and synced, not yet renamed into place
    after(checkpoint, "_fsync_tree")
elif point == "after-rename":      # the new step_<N> is in place, the old ones not yet pruned
    before(checkpoint, "_remove")
elif point == "mid-prune":         # an old checkpoint is half deleted
    rmtree = shutil.rmtree
    def partial_rmtree(path, *args, **kwargs):
        name = Path(path).name
        if "step_" in name and not name.startswith(".tmp-step_") and Path(path).is_dir():
            for file in sorted(Path(path).rglob("*.json")):
                file.unlink()      # state.json, scheduler.json, ...: what makes a checkpoint loadable
            hit()
        return rmtree(path, *args, **kwargs)
    shutil.rmtree = partial_rmtree
else:
    raise SystemExit(f"unknown kill point {point}")
sys.exit(main(sys.argv[1:]))
'''


def test_sigkill_at_each_point_of_a_step_and_a_save_then_resume_matches_an_uninterrupted_run(reference, tmp_path):
    """One run killed five times, each resume at a different point; no visible checkpoint is ever partial,
    each resume starts from the newest complete one, and the metrics equal the uninterrupted run's."""
    driver = tmp_path / "kill_driver.py"
    driver.write_text(KILL_DRIVER)
    run_dir = tmp_path / "run"
    # (kill point, n-th hit, checkpoint the next start must resume from)
    plan = [("optimizer-step", 3, 1),      # step 1 saved; killed after step 2's critic update
            ("save-half-written", 2, 2),   # saves step 2, killed writing step 3
            ("before-rename", 1, 2),       # step 3 written in full but never renamed: not picked
            ("after-rename", 1, 3),        # step 3 renamed into place, step 1 not yet pruned
            ("mid-prune", 1, 4)]           # step 4 in place, killed while deleting step 1
    expected_resume = None
    for point, n, resume_step in plan:
        proc = subprocess.run([sys.executable, str(driver), *ppo_args(run_dir)], cwd=ROOT, capture_output=True,
                              text=True, timeout=300, env=cli_env(NANOVERL_TEST_KILL=f"{point}:{n}"))
        assert proc.returncode == -signal.SIGKILL, (point, proc.returncode, proc.stderr[-3000:])
        if expected_resume:
            assert f"resumed from {run_dir / 'checkpoints' / f'step_{expected_resume:06d}'}" in proc.stderr, proc.stderr
        assert soak.check_checkpoints(run_dir) == [], point  # every visible step_<N> is complete and loads
        assert soak.checkpoint_steps(run_dir)[-1] == resume_step, (point, checkpoints(run_dir))
        expected_resume = resume_step
    assert ".tmp-del-step_000001" in checkpoints(run_dir)  # the half-deleted step 1, hidden from resume
    proc = run_cli(*ppo_args(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"step_{expected_resume:06d} (step {expected_resume})" in proc.stderr
    assert not any(name.startswith(".tmp-") for name in checkpoints(run_dir))  # cleaned at the start
    assert soak.metric_rows(run_dir) == soak.metric_rows(reference)


def test_external_sigkill_while_a_checkpoint_is_written_is_never_resumed_from(reference, tmp_path):
    """A real SIGKILL from outside the moment a temporary checkpoint folder appears."""
    run_dir = tmp_path / "run"
    hits = 0
    for attempt in range(3):
        child = subprocess.Popen(soak.command(run_dir, STEPS), cwd=ROOT, env=cli_env(), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        root = run_dir / "checkpoints"
        start = soak.checkpoint_steps(run_dir)
        leftover = root.is_dir() and any(p.name.startswith(".tmp-step_") for p in os.scandir(root))
        while child.poll() is None:
            saving = root.is_dir() and any(p.name.startswith(".tmp-step_") for p in os.scandir(root))
            # a folder left by the previous kill is not a save in progress: wait for this run's own saves
            if saving and (not leftover or soak.checkpoint_steps(run_dir) != start):
                child.send_signal(signal.SIGKILL)
                hits += 1
                break
            time.sleep(0.0005)
        child.wait(timeout=300)
        assert soak.check_checkpoints(run_dir) == []
        if hits >= 2:
            break
    assert hits >= 1, "no save was caught in progress"
    proc = run_cli(*ppo_args(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert soak.metric_rows(run_dir) == soak.metric_rows(reference)


SOAK_KILLS = 20 if os.environ.get("NANOVERL_SLOW") == "1" else 5


def test_kill_resume_soak_ends_with_the_uninterrupted_metrics(tmp_path):
    """scripts/kill_resume_soak.py: SOAK_KILLS seeded random SIGKILLs (20 with NANOVERL_SLOW=1)."""
    summary = soak.soak(SOAK_KILLS, seed=0, out=tmp_path)
    assert summary["problems"] == [], summary["problems"]
    assert summary["kills"] == SOAK_KILLS, summary["events"]
    assert summary["identical"], summary


# ---- disk full -----------------------------------------------------------------------------------
def _file_size_limit(limit: int):
    def apply():  # writes past `limit` bytes fail with EFBIG instead of killing the process with SIGXFSZ
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_write_error_during_a_save_keeps_the_previous_checkpoint_and_says_so(tmp_path):
    run_dir = tmp_path / "run"
    assert run_cli(*ppo_args(run_dir, steps=2)).returncode == 0
    before = {p: p.read_bytes() for p in (run_dir / "checkpoints" / "step_000002").rglob("*") if p.is_file()}
    # 300 kB: the actor's model.safetensors (~550 kB) fails in safetensors; 800 kB: optimizer.pt (~1.1 MB) in torch.save
    for limit in (300_000, 800_000):
        proc = subprocess.run([sys.executable, "-m", "nanoverl_core.cli", *ppo_args(run_dir, steps=4)], cwd=ROOT,
                              env=cli_env(), capture_output=True, text=True, timeout=300,
                              preexec_fn=_file_size_limit(limit))
        assert_user_error(proc, "could not write checkpoint step 3", "the newest complete checkpoint step_000002 is intact",
                          "free disk space")
        assert checkpoints(run_dir) == ["step_000001", "step_000002"]  # no temporary folder left either
        assert {p: p.read_bytes() for p in before} == before
    proc = run_cli(*ppo_args(run_dir, steps=4))
    assert proc.returncode == 0 and "step_000002 (step 2)" in proc.stderr, proc.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3, 4]


def test_disk_full_before_the_first_step_is_one_line_not_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "nanoverl_core.cli", *ppo_args(tmp_path / "run", steps=2)], cwd=ROOT,
                          env=cli_env(), capture_output=True, text=True, timeout=300,
                          preexec_fn=_file_size_limit(2_000))  # config.json (~3 kB) cannot be written
    assert_user_error(proc, "File too large", "free disk space")


# ---- non-finite losses ---------------------------------------------------------------------------
# scores of 1e38 are finite (so the reward checks pass) but overflow REINFORCE++'s whitening: the
# advantages and the loss turn NaN. The first two steps (2 x 16 prompts x 8 samples) score normally.
HUGE_REWARD = """
calls = 0

def compute_score(prompt, response, sample):
    global calls
    calls += 1
    return 1e38 if calls > 256 else float(response.strip() == sample["target"])
"""
NONFINITE = ["trainer.progress=none", "trainer.total_steps=4", "trainer.save_every=1", "trainer.keep_checkpoints=10",
             "data.val_files=[]", "tracking.trackers=[jsonl]",
             "reward.workers=0"]  # in the trainer process: one call counter (each pool worker would have its own)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "actor" / "model.safetensors"))


def _all_finite(run_dir: Path) -> bool:
    return all(torch.isfinite(t).all() for f in (run_dir / "checkpoints").rglob("*.safetensors")
               for t in load_file(str(f)).values())


def test_nonfinite_loss_with_on_nonfinite_stop_exits_2_and_keeps_the_last_good_checkpoint(tmp_path):
    reward = tmp_path / "huge.py"
    reward.write_text(HUGE_REWARD)
    run_dir = tmp_path / "run"
    proc = run_cli("--config", REINFORCE, *NONFINITE, f"reward.file={reward}", "trainer.on_nonfinite=stop",
                   f"trainer.output_dir={run_dir}")
    assert_user_error(proc, "step 3: non-finite loss", "the optimizer did not step", "trainer.on_nonfinite=skip")
    assert checkpoints(run_dir) == ["step_000001", "step_000002"]
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]
    assert _all_finite(run_dir)


def test_nonfinite_loss_with_on_nonfinite_skip_leaves_the_weights_untouched_and_counts_it(tmp_path):
    reward = tmp_path / "huge.py"
    reward.write_text(HUGE_REWARD)
    run_dir = tmp_path / "run"
    proc = run_cli("--config", REINFORCE, *NONFINITE, f"reward.file={reward}", "trainer.on_nonfinite=skip",
                   f"trainer.output_dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning: step 3: non-finite loss (nan); the optimizer did not step; skipped" in proc.stderr
    rows = read_metrics(run_dir)
    assert [r.get("actor/skipped_updates", 0.0) for r in rows] == [0.0, 0.0, 1.0, 1.0]
    ckpt = run_dir / "checkpoints"
    good = _weights(ckpt / "step_000002")
    assert any(not torch.equal(good[k], v) for k, v in _weights(ckpt / "step_000001").items())  # steps 1-2 trained
    for step in ("step_000003", "step_000004"):  # the skipped steps changed neither weights nor optimizer state
        assert all(torch.equal(good[k], v) for k, v in _weights(ckpt / step).items())
        assert (ckpt / step / "actor" / "optimizer.pt").read_bytes() == \
            (ckpt / "step_000002" / "actor" / "optimizer.pt").read_bytes()
    assert _all_finite(run_dir)


def test_diverged_weights_stop_the_run_at_the_rollout_with_one_line(tmp_path):
    """A huge learning rate gives finite but enormous weights after step 1; step 2's logits overflow."""
    run_dir = tmp_path / "run"
    proc = run_cli("--config", REINFORCE, *NONFINITE, "actor.lr=3e37", f"trainer.output_dir={run_dir}")
    assert_user_error(proc, "logits are NaN/inf during rollout", "lower actor.lr")
    assert checkpoints(run_dir) == ["step_000001"] and _all_finite(run_dir)


def test_a_checkpoint_is_never_written_with_nan_weights(tmp_path):
    from nanoverl_core.builtins.debug import make_workers
    from nanoverl_core.config import load_config
    from nanoverl_core.errors import CheckpointError
    from nanoverl_core.plugins import load_registry
    from nanoverl_core.trainer.checkpoint import save_checkpoint

    cfg = load_config(PPO, [f"trainer.output_dir={tmp_path}"], registry=load_registry())
    workers = make_workers(cfg)
    root = tmp_path / "checkpoints"
    save_checkpoint(root, 1, workers, {"step": 1}, keep=2)
    for part in ("critic", "actor"):
        with torch.no_grad():
            param = next(getattr(workers, part).module.parameters())
            param.view(-1)[0] = float("nan")
        with pytest.raises(CheckpointError, match=f"step 2: the {part}'s weights hold NaN or inf.*step_000001 is intact"):
            save_checkpoint(root, 2, workers, {"step": 2}, keep=2)
        assert checkpoints(tmp_path) == ["step_000001"]


# ---- trackers and damaged checkpoints ------------------------------------------------------------
@pytest.fixture(scope="module")
def faults_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("faults-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(FIXTURES / "nanoverl-fixture-faults")], check=True, capture_output=True)
    return site


def test_a_tracker_that_raises_never_stops_training_or_resuming(faults_site, tmp_path):
    env = cli_env(PYTHONPATH=str(faults_site))
    run_dir = tmp_path / "run"
    args = ["--config", REINFORCE, "trainer.progress=none", "trainer.save_every=1", "data.val_files=[]",
            "tracking.trackers=[exploding, jsonl]", f"trainer.output_dir={run_dir}"]
    proc = run_cli(*args, "trainer.total_steps=2", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for method, error in (("log_metrics", "ConnectionError"), ("log_samples", "ValueError"),
                          ("state_dict", "no state"), ("close", "OSError")):
        assert f"warning: tracker exploding: {method} failed" in proc.stderr and error in proc.stderr, method
    proc = run_cli(*args, "trainer.total_steps=3", env=env)  # the checkpoints hold no state for it
    assert proc.returncode == 0 and "(step 2)" in proc.stderr, proc.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3]


@pytest.mark.parametrize("damage", ["truncated-weights", "foreign-optimizer", "no-critic"])
def test_a_damaged_checkpoint_is_refused_with_one_line(reference, tmp_path, damage):
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    newest = run_dir / "checkpoints" / f"step_{STEPS:06d}"
    if damage == "truncated-weights":
        weights = newest / "critic" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
        needles = ["cannot be loaded", "SafetensorError"]
    elif damage == "foreign-optimizer":
        torch.save({"not": "an optimizer"}, newest / "actor" / "optimizer.pt")
        needles = ["cannot be loaded", "does not match this config"]
    else:
        shutil.rmtree(newest / "critic")
        needles = ["has no critic but critic.enable = true"]
    proc = run_cli(*ppo_args(run_dir, steps=STEPS + 1))
    assert_user_error(proc, f"step_{STEPS:06d}", *needles)


FAILING_ENGINE = '''
"""nanoverl-train whose rollout engine fails for good (RolloutError, what the vLLM rollout raises after a
restart failed too) in the generate call of step 3."""
import sys
from nanoverl_core import RolloutError
from nanoverl_core.builtins.debug import DebugRollout
from nanoverl_core.cli import main

generate, calls = DebugRollout.generate, []


def failing(self, batch, params):
    calls.append(1)
    if len(calls) == 3:
        raise RolloutError("the vLLM engine failed again after a restart (EngineDeadError); the run stops here")
    return generate(self, batch, params)


DebugRollout.generate = failing
sys.exit(main(sys.argv[1:]))
'''


def test_a_rollout_engine_that_fails_for_good_stops_with_one_line_naming_the_checkpoint(tmp_path):
    driver, run_dir = tmp_path / "failing_engine.py", tmp_path / "run"
    driver.write_text(FAILING_ENGINE)
    args = ["--config", REINFORCE, "trainer.total_steps=4", "trainer.save_every=1", "trainer.val_every=0",
            "trainer.progress=none", f"trainer.output_dir={run_dir}"]
    proc = subprocess.run([sys.executable, str(driver), *args], cwd=ROOT, env=cli_env(), capture_output=True,
                          text=True, timeout=120)
    assert_user_error(proc, "step 3: the vLLM engine failed again",
                      f"it resumes from {run_dir / 'checkpoints' / 'step_000002'}")
    assert checkpoints(run_dir) == ["step_000001", "step_000002"]
    assert run_cli(*args).returncode == 0 and [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3, 4]
