"""End to end through `nanoverl-train` in a subprocess, as a user runs it."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nanoverl_core.testing import without_machine_metrics

REPO = Path(__file__).resolve().parents[3]
TRAIN = shutil.which("nanoverl-train") or str(Path(sys.executable).parent / "nanoverl-train")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def train(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([TRAIN, *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(importlib.util.find_spec("nanoverl_grpo") is None, reason="needs nanoverl-grpo")
def test_tiny_grpo_reward_rises(tmp_path):
    """100 GRPO steps of the quickstart config (~20 s on one thread): the mean reward at least doubles, and
    the output ends with the step line of the form the README's Quickstart shows (not a terminal: one line
    per step, nothing after the last)."""
    run = train("--config", "examples/configs/tiny_grpo.toml", "trainer.total_steps=100",
                f"trainer.output_dir={tmp_path / 'run'}", "trainer.val_every=100", "trainer.save_every=0",
                "tracking.trackers=[console,jsonl]")
    assert run.returncode == 0, run.stderr[-3000:]
    last = run.stdout.rstrip("\n").splitlines()[-1]
    assert re.fullmatch(r"step 100/100 reward/mean=\S+ val/reward/mean=\S+ actor/pg_loss=\S+ "
                        r"rollout/response_length/mean=\S+ time_left=0s", last), last
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rewards = [row["reward/mean"] for row in rows]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert len(rows) == 100 and first < 0.12, first                                # random level: ~1/14 a position
    assert last > max(0.15, 2 * first), (first, last)
    assert rows[-1]["val/reward/mean"] > 0.15
    assert (tmp_path / "run" / "checkpoints").is_dir()


def test_the_quickstart_config_scores_a_response_that_never_stops_below_one_that_stops():
    """The Quickstart's model never emitted EOS (greedy "6162<bos><bos>", truncated_frac 1.0 after 400 steps):
    char_match reads the decoded text, which drops special tokens, so a response that runs to
    rollout.max_new_tokens scored what "6162<eos>" does. tiny_grpo.toml's overlong penalty over the
    budget's last token makes stopping pay, and the rollout's stop id is the tokenizer's EOS."""
    import attrs
    from transformers import AutoTokenizer

    from nanoverl_core import load_config, load_registry, responses_to_batch
    from nanoverl_core.reward import RewardScorer

    registry = load_registry()
    config = load_config(REPO / "examples" / "configs" / "tiny_grpo.toml", registry=registry, training=False)
    tokenizer = AutoTokenizer.from_pretrained(REPO / config.model.path)
    digits, bos, eos = tokenizer.encode("6162"), tokenizer.bos_token_id, tokenizer.eos_token_id
    assert len(digits) == 4 and eos == 2 and config.rollout.max_new_tokens == 6
    batch = responses_to_batch([digits + [bos, bos], digits + [eos]], eos_token_id=eos,
                               pad_token_id=tokenizer.pad_token_id, max_new_tokens=config.rollout.max_new_tokens)
    for key, value in dict(prompt_text=["6162="] * 2, row=[{"target": "6162"}] * 2, index=[0, 1],
                           data_source=["tiny_copy"] * 2).items():
        batch[key] = value
    scorer = RewardScorer(attrs.evolve(config.reward, workers=0), registry,
                          max_new_tokens=config.rollout.max_new_tokens)
    scored, metrics = scorer.score_batch(batch, tokenizer)
    assert batch["truncated"].tolist() == [True, False] and scored["response_text"] == ["6162", "6162"]
    assert scored["score"].tolist() == [pytest.approx(0.9), 1.0]


def test_a_missing_gguf_file_exits_2_with_one_error_line(tmp_path):
    missing = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    run = train("--config", "examples/configs/smollm2_gsm8k_cpu.toml", f"model.path={missing}",
                "data.train_files=[examples/data/tiny_copy/train.jsonl]", f"trainer.output_dir={tmp_path / 'run'}",
                "algorithm.advantage_estimator=reinforce_plus_plus", timeout=60)  # a core estimator: no nanoverl-grpo needed
    assert run.returncode == 2, run.stderr[-3000:]
    lines = run.stderr.strip().splitlines()
    assert lines[-1].startswith("error: model.path") and "does not exist" in lines[-1], run.stderr
    assert "Traceback" not in run.stderr


def one_error_line(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, run.stderr[-3000:]
    return errors[0]


def test_a_gguf_model_without_the_gguf_package_exits_2_with_the_pip_line(tmp_path):
    """The package hidden from this one process (sys.modules["gguf"] = None: find_spec says it is absent)."""
    model = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model.write_bytes(b"GGUF")
    code = 'import sys; sys.modules["gguf"] = None; from nanoverl_core.cli import main; sys.exit(main())'
    run = subprocess.run([sys.executable, "-c", code, "--config", "examples/configs/smollm2_arithmetic.toml",
                          f"model.path={model}", f"trainer.output_dir={tmp_path / 'run'}", "rollout.name=hf",
                          "algorithm.advantage_estimator=reinforce_plus_plus"],
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    line = one_error_line(run)
    assert line.startswith("error: model.path") and "pip install gguf" in line, line
    assert not (tmp_path / "run").exists()


def test_chat_prompts_for_a_tokenizer_without_a_chat_template_exit_2(tmp_path):
    """The tiny copy model's tokenizer has no chat template; the arithmetic rows are chats."""
    run = train("--config", "examples/configs/tiny_grpo.toml", NO_GRPO, f"trainer.output_dir={tmp_path / 'run'}",
                "data.train_files=[examples/data/arithmetic/train.jsonl]", "data.val_files=[]")
    line = one_error_line(run)
    assert "train.jsonl row 0" in line and "no chat template" in line and "data.apply_chat_template" in line, line
    assert not list((tmp_path / "run").glob("checkpoints/*"))


NO_GRPO = "algorithm.advantage_estimator=reinforce_plus_plus"
"""The tiny config without nanoverl-grpo's estimator (the hf session runs without that plugin)."""


def test_rollout_correction_with_the_hf_rollout_is_refused_by_the_dry_run_as_by_the_run(tmp_path):
    """The hf rollout declares no `log_probs` setting, so it returns none: the dry-run refuses what the run
    refuses, before anything is written."""
    args = ["--config", "examples/configs/tiny_grpo.toml", NO_GRPO, f"trainer.output_dir={tmp_path / 'run'}",
            "algorithm.rollout_correction.is_level=token"]
    for run in (train(*args, "--dry-run"), train(*args)):
        line = one_error_line(run)
        assert "algorithm.rollout_correction.is_level = 'token'" in line and "rollout.name = 'hf'" in line, line
        assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Two GRPO-free (REINFORCE++) steps of the tiny copy task with the hf worker, checkpointed."""
    run = tmp_path_factory.mktemp("tiny_run") / "run"
    proc = train("--config", "examples/configs/tiny_grpo.toml", NO_GRPO,
                 "trainer.total_steps=2", "trainer.val_every=0", "trainer.progress=none", "actor.lr=1e-2",
                 "tracking.trackers=[jsonl]", f"trainer.output_dir={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


def test_export_writes_a_folder_transformers_loads_with_the_trained_logits(tiny_run, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nanoverl_core import load_config, load_registry
    from nanoverl_hf.workers import make_workers

    out = tmp_path / "exported"
    proc = train("export", str(tiny_run), str(out))
    assert proc.returncode == 0 and f"wrote {out}" in proc.stdout, proc.stderr[-3000:]
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    # the trainer's own view of the checkpoint: the hf worker, loaded the way a resume loads it
    config = load_config(REPO / "examples" / "configs" / "tiny_grpo.toml", ["trainer.device=cpu"],
                         registry=load_registry())
    actor = make_workers(config).actor
    actor.load(tiny_run / "checkpoints" / "step_000002" / "actor")
    ids = torch.tensor([tokenizer.encode("1234="), tokenizer.encode("9876=")])
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids).logits, actor.module.eval()(input_ids=ids).logits,
                                   rtol=0, atol=1e-6)
        fresh = make_workers(config).actor.module.eval()(input_ids=ids).logits       # the untrained init differs
    assert not torch.allclose(exported(input_ids=ids).logits, fresh, atol=1e-4)
    assert exported.config.use_cache and not list(tmp_path.glob(".tmp-*"))


def test_export_and_eval_refuse_bad_inputs_with_one_line_and_write_nothing(tiny_run, tmp_path):
    before = sorted(p.name for p in tiny_run.rglob("*"))
    existing = tmp_path / "full"
    existing.mkdir()
    (existing / "x").write_text("keep")
    for args, needles in [
        (["export", str(tiny_run), str(existing)], ["already exists and is not an empty folder"]),
        (["export", str(tmp_path / "nothing"), str(tmp_path / "o")], ["neither a checkpoint folder"]),
        (["eval", "--config", "examples/configs/debug_ppo.toml", "--checkpoint", str(tiny_run)],
         ["cannot be loaded", "does not match this config"]),           # a checkpoint of another architecture
        (["eval", "--config", "examples/configs/tiny_grpo.toml", "data.val_files=[]", NO_GRPO],
         ["data.val_files is empty"]),
    ]:
        proc = train(*args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (args, proc.stderr[-2000:])
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and all(n in errors[0] for n in needles), (args, errors)
    assert (existing / "x").read_text() == "keep" and not (tmp_path / "o").exists()
    assert sorted(p.name for p in tiny_run.rglob("*")) == before


def test_eval_scores_the_base_model_and_a_checkpoint_without_touching_the_run(tiny_run):
    before = sorted(str(p) for p in tiny_run.rglob("*"))
    reports = {}
    for name, extra in (("base", []), ("trained", ["--checkpoint", str(tiny_run)])):
        proc = train("eval", "--config", "examples/configs/tiny_grpo.toml", "--json", *extra, "rollout.val_n=3", NO_GRPO)
        assert proc.returncode == 0, proc.stderr[-3000:]
        reports[name] = json.loads(proc.stdout)
    base, trained = reports["base"], reports["trained"]
    assert base["checkpoint"] is None and trained["checkpoint"].endswith("step_000002")
    assert base["prompts"] == trained["prompts"] == 64
    for report in (base, trained):
        greedy, sampled = report["results"]["greedy"], report["results"]["T=1"]
        assert greedy["n"] == 1 and greedy["reward/mean"] == greedy["reward/best@1"]
        assert sampled["n"] == 3 and 0 <= sampled["reward/mean"] <= sampled["reward/best@3"] <= 1
    assert base["results"]["greedy"] != trained["results"]["greedy"]        # the checkpoint's weights were used
    table = train("eval", "--config", "examples/configs/tiny_grpo.toml", NO_GRPO).stdout
    assert "greedy" in table and "mean@n" in table and "(base)" in table
    assert sorted(str(p) for p in tiny_run.rglob("*")) == before


KILL_MID_REFILL = '''
"""nanoverl-train that SIGKILLs itself in the second generation round of a step from step 3 on."""
import os, signal, sys
from nanoverl_core.cli import main
from nanoverl_core.trainer.trainer import Trainer

generate_round = Trainer.generate_round


def killing(self, timing, gen_round=0):
    if self.step >= 3 and gen_round == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return generate_round(self, timing, gen_round)


Trainer.generate_round = killing
sys.exit(main(sys.argv[1:]))
'''


@pytest.mark.skipif(importlib.util.find_spec("nanoverl_grpo") is None, reason="needs nanoverl-grpo")
def test_tiny_grpo_with_dynamic_sampling_killed_mid_refill_resumes_identically(tmp_path):
    """The tiny task with GRPO and algorithm.filter_groups, 2 samples a prompt (many groups score alike, so
    steps refill, and rounds may differ in response width): SIGKILLed in a step's second round and resumed, it
    ends with the uninterrupted run's metrics and weights."""
    import signal

    import torch
    from safetensors.torch import load_file

    args = ["--config", "examples/configs/tiny_grpo.toml", "trainer.progress=none", "tracking.trackers=[jsonl]",
            "data.batch_size=8", "rollout.n=2", "algorithm.filter_groups=true", "algorithm.filter_groups_max_rounds=3",
            "trainer.total_steps=4", "trainer.save_every=1", "trainer.val_every=2"]
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    assert train(*args, f"trainer.output_dir={reference}").returncode == 0
    driver = tmp_path / "driver.py"
    driver.write_text(KILL_MID_REFILL)
    proc = subprocess.run([sys.executable, str(driver), *args, f"trainer.output_dir={run_dir}"], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    resumed = train(*args, f"trainer.output_dir={run_dir}")
    assert resumed.returncode == 0 and "resumed from" in resumed.stderr, resumed.stderr[-3000:]

    def rows(folder):
        return [without_machine_metrics(json.loads(line)) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert any(r["filter/rounds"] > 1 for r in rows(reference)[2:])
    assert rows(run_dir) == rows(reference)
    a, b = (load_file(str(d / "checkpoints" / "step_000004" / "actor" / "model.safetensors")) for d in (reference, run_dir))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("prompt", ["1 2=", "\n", "12é="], ids=["space", "blank-line", "accent"])
def test_a_prompt_the_hf_tokenizer_cannot_encode_names_file_and_row(tmp_path, prompt):
    """The tiny model's WordLevel tokenizer has no [UNK]: it raises a bare Exception for any character
    outside its alphabet (a blank line too); that is one line naming the file and row, not a traceback."""
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps({"prompt": text, "answer": "1"}) + "\n" for text in ["12=", "34=", prompt]))
    run = train("--config", "examples/configs/tiny_grpo.toml", NO_GRPO, f"trainer.output_dir={tmp_path / 'run'}",
                f"data.train_files=[{rows}]", "data.val_files=[]")
    line = one_error_line(run)
    assert f"{rows} row 2" in line and "cannot encode the prompt" in line, line
    assert not (tmp_path / "run").exists()
