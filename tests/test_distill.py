"""On-policy distillation: the per-token reverse-KL advantage pinned by hand, the `distill` estimator with and
without a task estimator, the teacher pass in the step plan, a debug run whose teacher is a checkpoint (equal to
the student: no signal; trained: the student's KL to it falls), and each config mistake as one error line."""

import json

import pytest
import torch

from conftest import EXAMPLES, read_metrics, run_cli
from nanoverl_core.algos import reinforce_plus_plus
from nanoverl_core.algos.distill import Distill, compute_distillation_advantage, distill
from nanoverl_core.algos.distill_settings import DistillSettings
from nanoverl_core.batch import RLBatch
from nanoverl_core.config import AlgorithmConfig, load_config
from nanoverl_core.errors import ConfigError
from nanoverl_core.plugins import load_registry
from nanoverl_core.trainer.plan import plan_step

CONFIG = EXAMPLES / "debug_reinforce.toml"


def algorithm(**settings) -> AlgorithmConfig:
    config = AlgorithmConfig()
    config.settings = DistillSettings(**settings)
    return config


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32),
                               torch.as_tensor(expected, dtype=torch.float32), rtol=0, atol=tol)


# Row 0: three tokens, then padding whose (garbage) log-probs must not count. Row 1: a masked token inside
# (a tool observation in a multi-turn row).
OLD = torch.tensor([[-1.0, -0.5, -2.0, -9.0], [-0.1, -3.0, -0.2, -0.7]])
TEACHER = torch.tensor([[-0.5, -0.5, -4.0, 0.0], [-0.3, -0.1, -0.2, -0.2]])
MASK = torch.tensor([[1.0, 1, 1, 0], [1, 0, 1, 1]])


def test_the_advantage_is_log_teacher_minus_log_student_on_counted_tokens():
    # row 0: -0.5 - -1 = 0.5, 0, -4 - -2 = -2, padding 0; row 1: -0.2, masked 0, 0, -0.2 - -0.7 = 0.5
    close(compute_distillation_advantage(OLD, TEACHER, MASK), [[0.5, 0.0, -2.0, 0.0], [-0.2, 0.0, 0.0, 0.5]])
    close(compute_distillation_advantage(OLD, TEACHER, MASK, coef=2.0), [[1.0, 0.0, -4.0, 0.0], [-0.4, 0.0, 0.0, 1.0]])


def test_a_teacher_equal_to_the_student_gives_no_signal():
    adv, returns = distill(RLBatch({"old_log_probs": OLD, "teacher_log_probs": OLD.clone(), "loss_mask": MASK}),
                           algorithm())
    assert torch.equal(adv, torch.zeros_like(adv)) and torch.equal(returns, adv)


def test_a_task_estimator_adds_its_advantages_times_task_weight():
    scores = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 2.0]])
    batch = RLBatch({"old_log_probs": OLD, "teacher_log_probs": TEACHER, "loss_mask": MASK,
                     "token_level_rewards": scores})
    config = algorithm(coef=0.5, task_estimator="reinforce_plus_plus", task_weight=3.0)
    adv, returns = Distill(reinforce_plus_plus)(batch, config)
    task, task_returns = reinforce_plus_plus(batch, AlgorithmConfig())
    close(adv, 0.5 * (TEACHER - OLD) * MASK + 3.0 * task * MASK)
    close(returns, task_returns)                         # a critic would learn the task's returns


def test_what_the_task_estimator_needs_the_step_still_provides():
    registry = load_registry()
    config = load_config(CONFIG, [], registry=registry)
    assert distill.requires_teacher and distill.requires_old_log_probs
    assert not getattr(distill, "requires_critic", False)
    assert Distill(registry.get("advantage_estimator", "gae")).requires_critic
    config.algorithm.settings = DistillSettings(task_estimator="distill")
    with pytest.raises(ConfigError, match="task_estimator"):
        distill.bind(config, registry)


def test_the_plan_runs_a_teacher_pass_and_an_old_log_prob_pass_even_on_policy():
    config = load_config(CONFIG, [], registry=load_registry())
    plan = plan_step(config, distill, reference=False, critic=False, rollout_log_probs=True, teacher=True)
    assert plan.on_policy and plan.teacher and plan.old_log_probs == "pass"
    assert plan.describe()["teacher_log_probs"] == "a pass"
    assert plan_step(config, reinforce_plus_plus, reference=False, critic=False,
                     rollout_log_probs=False).describe()["teacher_log_probs"] == "off"


def _train(run_dir, *overrides):
    out = run_cli("--config", str(CONFIG), f"trainer.output_dir={run_dir}", "tracking.trackers=[jsonl]",
                  "trainer.val_every=0", *overrides)
    assert out.returncode == 0, out.stderr[-3000:]
    return read_metrics(run_dir)


def test_a_teacher_checkpoint_equal_to_the_student_gives_zero_kl_and_zero_advantages(tmp_path):
    _train(tmp_path / "teacher", "trainer.total_steps=1", "actor.lr=0")   # the initial policy of seed 0, saved
    steps = _train(tmp_path / "student", "trainer.total_steps=2", f"teacher.path={tmp_path / 'teacher'}",
                   "algorithm.advantage_estimator=distill")
    assert steps[0]["teacher/reverse_kl"] == 0.0 and steps[0]["advantages/mean"] == 0.0   # step 2: the student moved
    assert "timing/teacher_log_probs" in steps[0]


def test_the_student_moves_toward_a_trained_teacher(tmp_path):
    _train(tmp_path / "teacher", "trainer.total_steps=40")
    steps = _train(tmp_path / "student", "trainer.total_steps=40", f"teacher.path={tmp_path / 'teacher'}",
                   "algorithm.advantage_estimator=distill")
    first = sum(m["teacher/reverse_kl"] for m in steps[:5]) / 5
    last = sum(m["teacher/reverse_kl"] for m in steps[-5:]) / 5
    assert first > 0.05 and last < first / 3, (first, last)


def test_eval_does_not_load_the_teacher(tmp_path):
    """eval scores the policy alone: a teacher checkpoint it would fail to load is never read."""
    (tmp_path / "teacher" / "state.json").parent.mkdir()
    (tmp_path / "teacher" / "state.json").write_text("{}")     # a checkpoint without the policy's weights
    out = run_cli("eval", "--config", str(CONFIG), "--json", "data.val_batch_size=8", f"teacher.path={tmp_path / 'teacher'}",
                  "algorithm.advantage_estimator=distill", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    train = run_cli("--config", str(CONFIG), f"trainer.output_dir={tmp_path / 'out'}", f"teacher.path={tmp_path / 'teacher'}",
                    "algorithm.advantage_estimator=distill")
    assert train.returncode != 0                               # the trainer does read it


@pytest.mark.parametrize("overrides, expected", [
    (["algorithm.advantage_estimator=distill"], "needs a teacher; set teacher.path"),
    (["teacher.path={run}"], "does not read a teacher; use \"distill\""),
    (["algorithm.advantage_estimator=distill", "teacher.path={missing}"], "teacher.path = '{missing}' does not exist"),
    (["algorithm.advantage_estimator=distill", "teacher.path={empty_run}"], "neither a checkpoint folder"),
    (["algorithm.advantage_estimator=distill", "teacher.path={model}"], "names a model or an adapter, which worker.name = \"debug\""),
    (["algorithm.advantage_estimator=distill", "teacher.path={run}", "algorithm.distill.task_estimator=grpoo"],
     "algorithm.distill.task_estimator"),
    (["algorithm.advantage_estimator=distill", "teacher.path={data}"], "teacher.path"),
])
def test_each_teacher_mistake_is_one_error_line(tmp_path, overrides, expected):
    paths = {"run": tmp_path / "run", "missing": tmp_path / "nothing", "empty_run": tmp_path / "empty",
             "model": tmp_path / "model", "data": EXAMPLES / "data" / "debug_copy" / "train.jsonl"}
    (tmp_path / "run" / "checkpoints" / "step_000001").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "step_000001" / "state.json").write_text("{}")
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    dry_run = [] if "{model}" in " ".join(overrides) else ["--dry-run"]  # the worker's check: before any write
    out = run_cli("--config", str(CONFIG), f"trainer.output_dir={tmp_path / 'out'}", *dry_run,
                  *[o.format(**paths) for o in overrides])
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and lines[-1].startswith("error:"), out.stderr[-2000:]
    assert expected.format(**paths) in lines[-1] and "Traceback" not in out.stderr
    assert not (tmp_path / "out" / "checkpoints").exists()
