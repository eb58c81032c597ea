"""The exit-status contract through the real CLI: status 2, one `error:` line, no traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import EXAMPLES, ROOT, assert_user_error, cli_env, run_cli
from nanoverl_core.config import MOVED_KEYS

DEBUG = str(EXAMPLES / "debug_ppo.toml")
REINFORCE = str(EXAMPLES / "debug_reinforce.toml")


def test_dry_run_prints_the_resolved_config_and_loads_no_backend(tmp_path):
    proc = run_cli("--config", DEBUG, "--dry-run", "trainer.total_steps=3", f"trainer.output_dir={tmp_path}/run")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["config"]["trainer"]["total_steps"] == 3
    assert {"kind": "advantage_estimator", "name": "gae", "provider": "nanoverl"} in out["plugins"]
    assert not (tmp_path / "run").exists()  # nothing written, no model built


def test_console_script_is_installed():
    exe = shutil.which("nanoverl-train", path=str(Path(__import__("sys").executable).parent))
    assert exe, "nanoverl-train is not on the venv's PATH"
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True, env=cli_env())
    assert proc.returncode == 0 and "--dry-run" in proc.stdout


@pytest.mark.parametrize("args, needles", [
    (["--config", "missing.toml"], ["missing.toml does not exist"]),
    (["--config", DEBUG, "trainer.totl_steps=3"], ["trainer.totl_steps", "trainer.total_steps"]),
    (["--config", DEBUG, "trainer.total_steps=lots"], ["trainer.total_steps"]),
    (["--config", DEBUG, "rollout.name=vlm"], ["rollout.name = 'vlm'", "available: debug"]),
    (["--config", REINFORCE, "algorithm.advantage_estimator=grpo_x"], ["algorithm.advantage_estimator"]),
    (["--config", REINFORCE, "algorithm.advantage_estimator=gae"], ["'gae' needs a critic"]),
    (["--config", DEBUG, "reward.name=exact_mach"], ["did you mean 'exact_match'"]),
    (["--config", DEBUG, "tracking.trackers=[consol]"], ["tracking.trackers", "console"]),
    (["--config", DEBUG, "notakey"], ["section.key=value"]),
    (["--dry-run"], ["data.train_files is empty", "--config"]),  # no --config: the defaults, which name no data
])
def test_user_errors_exit_2_with_one_line(args, needles):
    assert_user_error(run_cli(*args, "--dry-run"), *needles)


@pytest.mark.parametrize("old", MOVED_KEYS)
def test_a_moved_key_is_one_error_line_naming_its_new_place(old):
    table, _, key = MOVED_KEYS[old].rpartition(".")
    line = assert_user_error(run_cli("--config", DEBUG, "--dry-run", f"{old}=x"))
    assert line == f"error: {old} moved: write it as [{table}] {key} = ... (as an override: {MOVED_KEYS[old]}=...)"


def test_unparsable_config_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[trainer\ntotal_steps = 3\n")
    assert_user_error(run_cli("--config", str(bad), "--dry-run"), str(bad), "cannot be parsed")


def test_missing_data_file_is_named(tmp_path):
    proc = run_cli("--config", DEBUG, "data.train_files=[nowhere.jsonl]", f"trainer.output_dir={tmp_path}")
    assert_user_error(proc, "nowhere.jsonl does not exist")


def test_rows_without_the_prompt_key_name_file_and_row(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"question": "12=", "target": "12"}\n' * 20)
    proc = run_cli("--config", DEBUG, f"data.train_files=[{data}]", "data.val_files=[]", f"trainer.output_dir={tmp_path}/run")
    assert_user_error(proc, str(data), "row 0", "data.prompt_key", "question")


def test_unavailable_device_is_a_user_error(tmp_path):
    proc = run_cli("--config", DEBUG, "trainer.device=cuda:3", f"trainer.output_dir={tmp_path}")
    assert_user_error(proc, "trainer.device", "cuda:3")


def test_help_lists_the_commands():
    proc = run_cli("--help")
    assert proc.returncode == 0 and "plugins" in proc.stdout
    assert str(ROOT)  # run from the repo root like a user


def test_eval_samples_writes_every_scored_sample_with_its_data_row(tmp_path):
    """`eval --samples FILE.jsonl`: one line per scored sample (greedy: one a prompt; sampled: rollout.val_n a
    prompt) with the data row it came from, whose scores are the report's means and char_match's own values."""
    from nanoverl_core.builtins.rewards import char_match

    val = tmp_path / "val.jsonl"
    rows = [{"prompt": f"{p}=", "target": p, "data_source": src} for p, src in (("123", "a"), ("456", "b"), ("789", "a"))]
    val.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "samples.jsonl"
    args = ["eval", "--config", str(EXAMPLES / "debug_reinforce.toml"), "--json", "--samples", str(out),
            f"data.val_files=[{val}]", "rollout.val_n=2", "reward.workers=0"]
    proc = run_cli(*args, "data.val_batch_size=2", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)["results"]
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(s["decoding"], s["index"]) for s in written] == [("greedy", i) for i in range(3)] + \
        [("T=1", i) for i in (0, 0, 1, 1, 2, 2)]
    for s in written:
        assert list(s) == ["decoding", "index", "data_source", "prompt", "response", "score", "row"]
        assert s["row"] == rows[s["index"]] and s["data_source"] == rows[s["index"]]["data_source"]
        assert s["prompt"] == rows[s["index"]]["prompt"]
        assert s["score"] == pytest.approx(char_match(s["prompt"], s["response"], s["row"]))
    for decoding, metrics in report.items():
        scores = [s["score"] for s in written if s["decoding"] == decoding]
        assert metrics["reward/mean"] == pytest.approx(sum(scores) / len(scores))
    # progress on stderr, off a terminal one line per batch of data.val_batch_size prompts (2 here)
    progress = [line.split(",")[0] for line in proc.stderr.splitlines() if line.startswith("eval ")]
    assert progress == ["eval greedy: 2/3 prompts", "eval greedy: 3/3 prompts", "eval T=1: 2/3 prompts",
                        "eval T=1: 3/3 prompts"], proc.stderr[-2000:]
    quiet = run_cli(*args, "data.val_batch_size=2", "trainer.progress=none", timeout=300)
    assert quiet.returncode == 0 and not [line for line in quiet.stderr.splitlines() if line.startswith("eval ")]
    missing = run_cli(*args[:5], str(tmp_path / "nowhere" / "samples.jsonl"), *args[6:], timeout=300)
    assert_user_error(missing, "--samples", "does not exist")


def test_eval_needs_no_training_data_and_scores_the_first_val_max_samples_rows(tmp_path):
    """An evaluation-only config (no data.train_files) evaluates; training with it is still one line."""
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps({"prompt": f"{p}=", "target": p}) + "\n" for p in ("123", "456", "789")))
    args = ["--config", str(EXAMPLES / "debug_reinforce.toml"), "data.train_files=[]", f"data.val_files=[{val}]",
            "reward.workers=0"]
    proc = run_cli("eval", "--json", *args, "data.val_max_samples=2", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["prompts"] == 2
    assert_user_error(run_cli("--dry-run", *args, f"trainer.output_dir={tmp_path / 'run'}"), "data.train_files is empty")


def test_eval_json_stdout_holds_the_json_alone_whatever_prints(tmp_path):
    """`eval --json | jq` works even when a component prints to stdout, in the trainer or in a process it
    starts (vLLM's engine core logs there): during the evaluation fd 1 goes to stderr."""
    reward = tmp_path / "noisy.py"
    reward.write_text("import os, subprocess, sys\nprint('noise at import')\n\n"
                      "def compute_score(prompt, response, sample):\n"
                      "    print('noise in a call')\n"
                      "    subprocess.run([sys.executable, '-c', 'print(\"noise from a child\")'])\n"
                      "    return 1.0\n")
    proc = run_cli("eval", "--config", str(EXAMPLES / "debug_reinforce.toml"), "--json", "data.val_batch_size=8",
                   f"reward.file={reward}", "reward.workers=0", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["results"]["greedy"]["reward/mean"] == 1.0
    assert all(noise in proc.stderr for noise in ("noise at import", "noise in a call", "noise from a child"))
