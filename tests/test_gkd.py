"""The GKD loss ([algorithm.distill] top_k, gkd_coef, gkd_beta): the per-token generalized JSD pinned by hand
for beta 0, 0.5 and 1 (with padding and a mask), equal to TRL's `GKDTrainer.generalized_jsd_loss` over the
whole vocabulary, zero with a zero gradient for a teacher equal to the student, restricted to the teacher's
top-k by hand; the teacher pass's top-k columns, the actor's loss term, the step plan, a debug run where the
student's KL to a trained teacher falls under GKD alone, and each config mistake as one error line."""

import math

import pytest
import torch

from conftest import EXAMPLES, read_metrics, run_cli
from nanoverl_core.algos import agg_loss, loss_totals
from nanoverl_core.algos.distill import distill, generalized_jsd
from nanoverl_core.config import load_config
from nanoverl_core.plugins import load_registry
from nanoverl_core.trainer.plan import plan_step

CONFIG = EXAMPLES / "debug_reinforce.toml"


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32),
                               torch.as_tensor(expected, dtype=torch.float32), rtol=0, atol=tol)


# Two tokens per position. Position 0: teacher (0.5, 0.25) renormalized to (2/3, 1/3), student (0.25, 0.25) to
# (1/2, 1/2). Position 1: equal distributions. Position 2: padding (all zeros, as the batch holds it).
TEACHER = torch.log(torch.tensor([[[0.5, 0.25], [0.6, 0.2], [1.0, 1.0]]]))
STUDENT = torch.log(torch.tensor([[[0.25, 0.25], [0.3, 0.1], [1.0, 1.0]]]))
MASK = torch.tensor([[1.0, 1.0, 0.0]])
BY_HAND = {  # position 0; positions 1 and 2 are 0
    0.0: 2 / 3 * math.log((2 / 3) / (1 / 2)) + 1 / 3 * math.log((1 / 3) / (1 / 2)),           # KL(t || s) 0.0566330
    1.0: 1 / 2 * math.log((1 / 2) / (2 / 3)) + 1 / 2 * math.log((1 / 2) / (1 / 3)),           # KL(s || t) 0.0588915
    0.5: 0.5 * (2 / 3 * math.log((2 / 3) / (7 / 12)) + 1 / 3 * math.log((1 / 3) / (5 / 12)))  # m = (7/12, 5/12)
    + 0.5 * (1 / 2 * math.log((1 / 2) / (7 / 12)) + 1 / 2 * math.log((1 / 2) / (5 / 12))),   # 0.0143626
}


@pytest.mark.parametrize("beta, pinned", [(0.0, 0.0566330), (0.5, 0.0143626), (1.0, 0.0588915)])
def test_the_per_token_generalized_jsd_by_hand(beta, pinned):
    assert BY_HAND[beta] == pytest.approx(pinned, abs=1e-7)
    per_token = generalized_jsd(STUDENT, TEACHER, beta)
    close(per_token, [[pinned, 0.0, 0.0]])
    # aggregated over the mask as the policy loss is: token-mean over the two counted tokens, and with the
    # mini-batch's normalisers (one more counted token elsewhere in the mini-batch: 3 tokens)
    close(agg_loss(per_token, MASK, "token-mean"), pinned / 2)
    close(agg_loss(per_token, MASK, "token-mean", **loss_totals(torch.tensor([[1.0, 1, 0], [1, 0, 0]]))), pinned / 3)


def test_it_is_trls_generalized_jsd_over_the_whole_vocabulary():
    trl_gkd = pytest.importorskip("trl.experimental.gkd.gkd_trainer")
    gen = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(2, 5, 11, generator=gen) * 2, torch.randn(2, 5, 11, generator=gen) * 2
    labels = torch.tensor([[1, 2, 3, -100, -100], [4, -100, 5, 6, 7]])
    temperature = 0.7
    for beta in (0.0, 0.1, 0.5, 0.9, 1.0):
        ours = generalized_jsd(torch.log_softmax(student / temperature, -1),
                               torch.log_softmax(teacher / temperature, -1), beta)
        theirs = torch.tensor([[float(trl_gkd.GKDTrainer.generalized_jsd_loss(
            student[b:b + 1, t:t + 1], teacher[b:b + 1, t:t + 1], beta=beta, temperature=temperature,
            reduction="sum")) for t in range(5)] for b in range(2)])
        close(ours, theirs, tol=1e-5)
        masked = trl_gkd.GKDTrainer.generalized_jsd_loss(student, teacher, labels, beta=beta, temperature=temperature,
                                                         reduction="sum")
        close(agg_loss(ours, (labels != -100).float(), "token-sum"), masked, tol=1e-5)
        assert ours.min() >= 0


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_a_teacher_equal_to_the_student_gives_zero_and_no_gradient(beta):
    logits = torch.randn(2, 3, 9, generator=torch.Generator().manual_seed(1), requires_grad=True)
    log_probs = torch.log_softmax(logits, -1)
    teacher, ids = log_probs.detach().topk(4, dim=-1)
    gkd = generalized_jsd(log_probs.gather(-1, ids), teacher, beta)
    close(gkd, torch.zeros(2, 3), tol=1e-6)
    gkd.sum().backward()
    close(logits.grad, torch.zeros_like(logits), tol=1e-6)


def test_the_top_k_version_renormalizes_over_the_teachers_tokens():
    """V = 4, K = 2: the teacher's (0.5, 0.3, 0.15, 0.05) keeps its first two, renormalized to (0.625, 0.375);
    the uniform student's log-probs of them renormalize to (0.5, 0.5)."""
    teacher_full = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    student_full = torch.log(torch.full((4,), 0.25))
    top, ids = teacher_full.topk(2)
    assert ids.tolist() == [0, 1]
    student = student_full[ids]
    assert 0.625 * math.log(0.625 / 0.5) + 0.375 * math.log(0.375 / 0.5) == pytest.approx(0.0315840, abs=1e-7)
    assert 0.5 * math.log(0.5 / 0.625) + 0.5 * math.log(0.5 / 0.375) == pytest.approx(0.0322693, abs=1e-7)
    close(generalized_jsd(student, top, 0.0), 0.0315840)                 # KL(t || s) over the two tokens
    close(generalized_jsd(student, top, 1.0), 0.0322693)                 # KL(s || t)
    # not the full-vocabulary divergence: KL(teacher || student) over all four tokens differs
    full = float((teacher_full.exp() * (teacher_full - student_full)).sum())
    assert abs(full - 0.0315840) > 0.1


def debug_workers(*overrides):
    registry = load_registry()
    cfg = load_config(CONFIG, ["rollout.temperature=0.7", "actor.micro_batch_size=2", *overrides], registry=registry)
    return cfg, registry.get("worker", "debug")(cfg)


def sampled_batch(workers):
    from nanoverl_core.testing import prompt_batch

    batch = prompt_batch(workers.tokenizer, ["12=", "9876=", "5="])
    batch["responses"] = torch.randint(3, 12, (3, 4), generator=torch.Generator().manual_seed(0))
    batch["response_mask"] = (torch.arange(4)[None] < torch.tensor([4, 2, 1])[:, None]).float()
    batch["loss_mask"] = batch["response_mask"].clone()
    return batch


def test_the_teacher_pass_keeps_its_top_k_tokens_and_their_log_probs():
    _, workers = debug_workers()
    actor, batch = workers.actor, sampled_batch(workers)
    log_probs, ids, top = actor.compute_log_probs_and_top_k(batch, 5)
    assert ids.dtype == torch.int64 and ids.shape == top.shape == (3, 4, 5)
    close(log_probs, actor.compute_log_probs(batch))
    with torch.no_grad():                                 # by hand: the module's logits at temperature 0.7
        inputs, width = actor.forward_pass.module_inputs(batch)
        full = torch.log_softmax(actor.module(**inputs).logits[:, -width - 1:-1].float() / 0.7, dim=-1)
    want, want_ids = full.topk(5, dim=-1)
    mask = batch["response_mask"][:, :width, None]
    assert torch.equal(ids[:, :width], want_ids * mask.long()) and not ids[:, width:].any()
    close(top[:, :width], want * mask)


@pytest.mark.parametrize("layout", [[], ["actor.logits_chunk_size=2"]], ids=["full_logits", "chunked_head"])
def test_the_actor_adds_gkd_coef_times_the_aggregated_jsd_and_logs_it(layout):
    from nanoverl_core.algos import vanilla

    overrides = ["algorithm.advantage_estimator=distill", "algorithm.distill.coef=0", "algorithm.distill.top_k=4",
                 "algorithm.distill.gkd_coef=2", "algorithm.distill.gkd_beta=0.5", "actor.entropy_coeff=0",
                 "actor.lr=0", "actor.loss_agg_mode=seq-mean-token-mean", *layout]
    _, workers = debug_workers(*overrides)
    actor, batch = workers.actor, sampled_batch(workers)
    gen = torch.Generator().manual_seed(3)
    teacher = torch.log_softmax(torch.randn(3, 4, 4, generator=gen), -1) * batch["response_mask"][..., None]
    ids = torch.randint(0, 12, (3, 4, 4), generator=gen)
    batch.update(type(batch)({"teacher_topk_ids": ids, "teacher_topk_log_probs": teacher,
                              "advantages": torch.zeros(3, 4), "old_log_probs": actor.compute_log_probs(batch)}))
    with torch.no_grad():
        inputs, width = actor.forward_pass.module_inputs(batch)
        full = torch.log_softmax(actor.module(**inputs).logits[:, -width - 1:-1].float() / 0.7, dim=-1)
    student = torch.nn.functional.pad(full, (0, 0, 0, 4 - width)).gather(-1, ids)
    want = agg_loss(generalized_jsd(student, teacher, 0.5), batch["loss_mask"], "seq-mean-token-mean")
    metrics, _ = actor.on_policy_update(batch, vanilla)
    close(metrics["actor/gkd_loss"], want, tol=1e-5)
    close(metrics["actor/loss"], metrics["actor/pg_loss"] + 2 * want, tol=1e-5)
    assert metrics["actor/gkd_loss"] > 0.01


def test_the_plan_names_the_top_k_teacher_pass():
    config = load_config(CONFIG, ["algorithm.advantage_estimator=distill", "algorithm.distill.top_k=8",
                                  "algorithm.distill.gkd_coef=1", "algorithm.distill.coef=0"], registry=load_registry())
    plan = plan_step(config, distill, reference=False, critic=False, rollout_log_probs=True, teacher=True)
    assert plan.teacher_top_k == 8
    assert plan.describe()["teacher_log_probs"] == \
        "a pass, with the teacher's top-8 tokens per position and their log-probs (GKD)"
    assert plan_step(config, distill, reference=False, critic=False, rollout_log_probs=True).teacher_top_k == 0


def _train(run_dir, *overrides):
    out = run_cli("--config", str(CONFIG), f"trainer.output_dir={run_dir}", "tracking.trackers=[jsonl]",
                  "trainer.val_every=0", *overrides)
    assert out.returncode == 0, out.stderr[-3000:]
    return read_metrics(run_dir)


GKD = ["algorithm.advantage_estimator=distill", "algorithm.distill.coef=0", "algorithm.distill.gkd_coef=1",
       "algorithm.distill.top_k=8"]


def test_gkd_alone_moves_the_student_toward_a_trained_teacher(tmp_path):
    _train(tmp_path / "teacher", "trainer.total_steps=40")
    dry = run_cli("--config", str(CONFIG), "--dry-run", f"trainer.output_dir={tmp_path / 'student'}",
                  f"teacher.path={tmp_path / 'teacher'}", *GKD)
    assert dry.returncode == 0 and "top-8 tokens per position" in dry.stdout, dry.stdout + dry.stderr[-2000:]
    # no entropy bonus: the renormalized top-k term leaves the mass outside the teacher's top-k free, and the
    # bonus would push the student's mass there (its sampled tokens' KL to the teacher then rises again)
    steps = _train(tmp_path / "student", "trainer.total_steps=40", f"teacher.path={tmp_path / 'teacher'}",
                   "actor.entropy_coeff=0", *GKD)
    assert all(m["advantages/mean"] == 0.0 for m in steps)            # coef = 0: the GKD term is the only signal
    first, last = (sum(m["teacher/reverse_kl"] for m in part) / 5 for part in (steps[:5], steps[-5:]))
    assert first > 0.05 and last < first / 3, (first, last)          # 0.48 -> 0.12
    first, last = (sum(m["actor/gkd_loss"] for m in part) / 5 for part in (steps[:5], steps[-5:]))
    assert last < first / 10, (first, last)                          # 0.056 -> 0.0013
    assert all(0.5 < m["teacher/topk_mass"] <= 1 + 1e-6 for m in steps)


@pytest.mark.parametrize("overrides, expected", [
    (["algorithm.distill.gkd_coef=1"], "'gkd_coef' = 1 needs the teacher's top-k tokens, but 'top_k' = 0"),
    (["algorithm.distill.gkd_coef=-1", "algorithm.distill.top_k=4"], "gkd_coef"),
    (["algorithm.distill.gkd_beta=1.5"], "gkd_beta"),
    (["algorithm.distill.top_k=-2"], "top_k"),
])
def test_each_gkd_mistake_is_one_error_line(tmp_path, overrides, expected):
    (tmp_path / "run" / "checkpoints" / "step_000001").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "step_000001" / "state.json").write_text("{}")
    out = run_cli("--config", str(CONFIG), f"trainer.output_dir={tmp_path / 'out'}", f"teacher.path={tmp_path / 'run'}",
                  "algorithm.advantage_estimator=distill", *overrides)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and lines[-1].startswith("error:"), out.stderr[-2000:]
    assert expected in lines[-1] and "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists()
