"""A teacher for on-policy distillation with the hf worker: a model folder (its log-probs, and its top-k tokens for
GKD, are the ones transformers gives for that model), a checkpoint of a run, a teacher equal to the student (no
signal, with or without the GKD term), a teacher with another tokenizer (one error line, nothing written), and a
distillation run killed mid-step that resumes identically."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nanoverl_core import RLBatch, load_config, load_registry
from nanoverl_hf.tiny import build_tiny_model
from nanoverl_hf.workers import make_workers

REPO = Path(__file__).resolve().parents[3]
TRAIN = shutil.which("nanoverl-train") or str(Path(sys.executable).parent / "nanoverl-train")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
COPY_TASK = ["--config", "examples/configs/tiny_grpo.toml", "tracking.trackers=[jsonl]", "trainer.val_every=0",
             "algorithm.advantage_estimator=distill", "data.batch_size=4", "rollout.n=4"]


def train(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([TRAIN, *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A tiny model with weights (seed 7), the copy task's tokenizer: a teacher unlike the seed-0 student."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("teacher") / "model"
    shutil.copytree(REPO / "examples" / "tiny_task" / "model", folder)
    torch.manual_seed(7)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)  # drawn now
    return folder


def copy_task_rows(tok) -> RLBatch:
    """Two rows of the copy task: "0123=" answered "0123<eos>", "4567=" answered "45<eos>" (then padding)."""
    prompts = torch.tensor([tok.encode("0123="), tok.encode("4567=")])
    responses = torch.tensor([tok.encode("0123") + [tok.eos_token_id], tok.encode("45") + [tok.eos_token_id] * 3])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    return RLBatch({"prompts": prompts, "prompt_mask": torch.ones_like(prompts), "responses": responses,
                    "response_mask": mask, "loss_mask": mask.float()})


def transformers_log_probs(model, batch, temperature: float) -> torch.Tensor:
    """(B, R, V) log_softmax(logits / temperature) of `model` at each response position, as transformers computes
    them."""
    prompts = batch["prompts"]
    with torch.no_grad():
        logits = model(torch.cat([prompts, batch["responses"]], 1)).logits[:, prompts.shape[1] - 1:-1].float()
    return torch.log_softmax(logits / temperature, -1)


def test_a_model_teacher_scores_the_sampled_tokens_as_transformers_does(teacher_dir):
    from transformers import AutoModelForCausalLM

    config = load_config(REPO / "examples" / "configs" / "tiny_grpo.toml",
                         [f"teacher.path={teacher_dir}", "algorithm.advantage_estimator=distill",
                          "trainer.device=cpu"], registry=load_registry())
    workers = make_workers(config)
    assert workers.teacher is not None and not any(p.requires_grad for p in workers.teacher.module.parameters())
    batch = copy_task_rows(workers.tokenizer)
    got = workers.teacher.compute_log_probs(batch)
    model = AutoModelForCausalLM.from_pretrained(teacher_dir).eval()
    want = transformers_log_probs(model, batch, 1.0).gather(-1, batch["responses"][..., None])[..., 0] \
        * batch["response_mask"]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert not torch.allclose(got, workers.actor.compute_log_probs(batch))       # not the student's


def gkd_workers(teacher_dir, pack: bool):
    """hf workers with a model teacher and GKD at temperature 0.7, top_k = 5, and a two-row batch of the copy task."""
    config = load_config(REPO / "examples" / "configs" / "tiny_grpo.toml",
                         [f"teacher.path={teacher_dir}", "algorithm.advantage_estimator=distill", "trainer.device=cpu",
                          "rollout.temperature=0.7", "algorithm.distill.top_k=5", "algorithm.distill.gkd_coef=1",
                          "algorithm.distill.coef=0", f"actor.pack={str(pack).lower()}", "actor.logits_chunk_size=2",
                          "actor.entropy_coeff=0"], registry=load_registry())
    workers = make_workers(config)
    return workers, copy_task_rows(workers.tokenizer)


@pytest.mark.parametrize("pack", [False, True])
def test_a_model_teachers_top_k_is_transformers_own(teacher_dir, pack):
    """[algorithm.distill] top_k: the teacher pass's top-k ids and log-probs are transformers'
    log_softmax(logits / T).topk(K), padded rows or packed, whatever the LM head's chunking."""
    from transformers import AutoModelForCausalLM

    workers, batch = gkd_workers(teacher_dir, pack)
    mask = batch["response_mask"][..., None]
    log_probs, ids, top = workers.teacher.compute_log_probs_and_top_k(batch, 5)
    want, want_ids = transformers_log_probs(AutoModelForCausalLM.from_pretrained(teacher_dir).eval(), batch,
                                             0.7).topk(5, -1)
    assert ids.dtype == torch.int64 and torch.equal(ids, want_ids * mask)
    torch.testing.assert_close(top, want * mask, rtol=0, atol=1e-5)
    torch.testing.assert_close(log_probs, workers.teacher.compute_log_probs(batch), rtol=0, atol=1e-5)


@pytest.mark.parametrize("pack", [False, True])
def test_the_students_gkd_term_is_the_jsd_of_transformers_log_probs(teacher_dir, pack):
    """The actor's actor/gkd_loss: the generalized JSD (beta 0.5) of the student's and the teacher's
    transformers log-probs of the teacher's top-5, token-mean over the counted tokens, padded rows or packed."""
    from nanoverl_core.algos import agg_loss, vanilla
    from nanoverl_core.algos.distill import generalized_jsd

    workers, batch = gkd_workers(teacher_dir, pack)
    _, ids, top = workers.teacher.compute_log_probs_and_top_k(batch, 5)
    student = transformers_log_probs(workers.actor.module, batch, 0.7).gather(-1, ids)   # before the update's step
    batch.update(RLBatch({"teacher_topk_ids": ids, "teacher_topk_log_probs": top, "advantages": torch.zeros(2, 5),
                          "old_log_probs": workers.actor.compute_log_probs(batch)}))
    metrics, _ = workers.actor.on_policy_update(batch, vanilla)
    want = agg_loss(generalized_jsd(student, top, 0.5), batch["loss_mask"], "token-mean")
    assert float(want) > 1e-3                  # two random tiny models: near-uniform, a small but real JSD
    torch.testing.assert_close(torch.tensor(metrics["actor/gkd_loss"], dtype=torch.float32), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("gkd", [[], ["algorithm.distill.top_k=4", "algorithm.distill.gkd_coef=1"]],
                         ids=["reverse_kl", "with_gkd"])
def test_a_teacher_equal_to_the_student_gives_zero_kl(teacher_dir, tmp_path, gkd):
    run = train(*COPY_TASK, f"model.path={teacher_dir}", f"teacher.path={teacher_dir}", "trainer.total_steps=2",
                f"trainer.output_dir={tmp_path / 'run'}", *gkd)
    assert run.returncode == 0, run.stderr[-3000:]
    first = rows(tmp_path / "run")[0]
    assert first["teacher/reverse_kl"] == 0.0 and first["advantages/mean"] == 0.0
    if gkd:                                    # the GKD term of the student's top-4 against itself
        assert abs(first["actor/gkd_loss"]) < 1e-6


def test_a_checkpoint_teacher_is_the_policy_it_saved(teacher_dir, tmp_path):
    """Teacher = the seed-0 run's checkpoint after 0 learning (lr 0): the seed-0 student itself."""
    made = train("--config", "examples/configs/tiny_grpo.toml", "tracking.trackers=[jsonl]", "trainer.val_every=0",
                 "trainer.total_steps=1", "actor.lr=0", "algorithm.advantage_estimator=reinforce_plus_plus",
                 f"trainer.output_dir={tmp_path / 'teacher'}")                 # a core estimator: no nanoverl-grpo
    assert made.returncode == 0, made.stderr[-3000:]
    run = train(*COPY_TASK, f"teacher.path={tmp_path / 'teacher'}", "trainer.total_steps=1",
                f"trainer.output_dir={tmp_path / 'run'}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert rows(tmp_path / "run")[0]["teacher/reverse_kl"] == 0.0


def test_a_teacher_with_another_tokenizer_is_one_error_line_and_nothing_is_written(tmp_path):
    other = build_tiny_model(tmp_path / "other", alphabet="0123456789=+")
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(other)).save_pretrained(other)
    run = train(*COPY_TASK, f"teacher.path={other}", "trainer.total_steps=1", f"trainer.output_dir={tmp_path / 'run'}")
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and lines[-1].startswith("error: teacher.path"), run.stderr[-3000:]
    assert "another tokenizer than the student's" in lines[-1] and "Traceback" not in run.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


KILL_AFTER_TEACHER = '''
"""nanoverl-train that SIGKILLs itself at step 3, after the teacher's pass, before the update."""
import os, signal, sys
from nanoverl_core.cli import main
from nanoverl_core.trainer.trainer import Trainer

compute_advantages = Trainer.compute_advantages


def killing(self, batch):
    if self.step == 3:
        assert "teacher_log_probs" in batch
        os.kill(os.getpid(), signal.SIGKILL)
    return compute_advantages(self, batch)


Trainer.compute_advantages = killing
sys.exit(main(sys.argv[1:]))
'''


def test_a_distillation_run_killed_mid_step_resumes_identically(teacher_dir, tmp_path):
    from safetensors.torch import load_file

    from nanoverl_core.testing import without_machine_metrics

    common = [*COPY_TASK, f"teacher.path={teacher_dir}", "trainer.total_steps=4", "trainer.save_every=2"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert train(*common, f"trainer.output_dir={whole}").returncode == 0
    driver = tmp_path / "driver.py"
    driver.write_text(KILL_AFTER_TEACHER)
    proc = subprocess.run([sys.executable, str(driver), *common, f"trainer.output_dir={killed}"], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    resumed = train(*common, f"trainer.output_dir={killed}")
    assert resumed.returncode == 0 and "resumed from" in resumed.stderr, resumed.stderr[-3000:]
    assert [without_machine_metrics(r) for r in rows(killed)] == [without_machine_metrics(r) for r in rows(whole)]
    a, b = (load_file(str(d / "checkpoints" / "step_000004" / "actor" / "model.safetensors")) for d in (whole, killed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_lora_adapter_teacher_is_merged_into_the_students_model(tmp_path):
    """teacher.path = a peft adapter folder trained on the student's model: the teacher is that model with the
    adapter merged (its log-probs are peft's merged model's), the student's own weights untouched."""
    peft = pytest.importorskip("peft")
    from transformers import AutoConfig, AutoModelForCausalLM

    student = tmp_path / "student"
    shutil.copytree(REPO / "examples" / "tiny_task" / "model", student)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(student)).save_pretrained(student)
    lora = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(student),
                               peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    config = load_config(REPO / "examples" / "configs" / "tiny_grpo.toml",
                         [f"model.path={student}", f"teacher.path={tmp_path / 'adapter'}",
                          "algorithm.advantage_estimator=distill", "trainer.device=cpu"], registry=load_registry())
    assert config.teacher.adapter and not config.teacher.from_checkpoint
    workers = make_workers(config)
    batch = copy_task_rows(workers.tokenizer).index([0])          # "0123=" answered "0123<eos>", no padding
    merged = lora.merge_and_unload().eval()
    want = transformers_log_probs(merged, batch, 1.0).gather(-1, batch["responses"][..., None])[..., 0]
    torch.testing.assert_close(workers.teacher.compute_log_probs(batch), want, rtol=0, atol=1e-5)
    assert not torch.allclose(workers.actor.compute_log_probs(batch), want, atol=1e-3)   # the student is the base
