"""scripts/compare_scorers.py on a hand-made dump in the layout `nanoverl-train eval --samples` writes: the
counts, every disagreement class with its examples, the rows a scorer raises on, and its usage errors.
Run as a user runs it (a subprocess), with nanoverl-hf's `gsm8k` and this plugin's `math_verify` installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "compare_scorers.py"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def sample(response: str, gold: str | None, source: str = "openai/gsm8k", decoding: str = "greedy") -> dict:
    row = {"data_source": source, "prompt": [{"role": "user", "content": "?"}]}
    if gold is not None:
        row["reward_model"] = {"ground_truth": gold}
    return {"decoding": decoding, "index": 0, "data_source": source, "prompt": "?", "response": response,
            "score": 0.0, "row": row}


DUMP = [
    sample("48 + 24 = 72\n#### 72", "72"),                           # both correct
    sample("\\boxed{72}", "72"),
    sample("#### 73", "72"),                                         # both wrong
    sample("I do not know.", "72"),
    sample("#### 72\nThe 5 friends", "72"),                          # gsm8k only: math-verify ignores ####
    sample("So 60 + 12 = 72\n#### 72\nThat is 2 bags.", "72"),
    sample("He earns \\$18 per hour", "18"),                         # gsm8k only: math-verify finds no answer
    sample("3,4", "34"),                                             # gsm8k only: a comma between digits
    sample("The answer is \\boxed{\\frac{1}{2}}", "0.5"),            # math_verify only: \boxed{} (fraction)
    sample("so 10-5", "5", source="arithmetic_sub"),                 # math_verify only: an expression
    sample("half of it: 50%", "0.5"),                                # math_verify only: percent
    sample("#### 3", None),                                          # no ground truth: an error, not a verdict
]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=300)


def test_a_hand_made_dump_gives_every_count_and_disagreement_class(tmp_path):
    dump = tmp_path / "samples.jsonl"
    dump.write_text("".join(json.dumps(s) + "\n" for s in DUMP[:8]))
    bare = tmp_path / "bare.jsonl"                                    # rows without "row": the row is the line
    bare.write_text("".join(json.dumps({**s["row"], "response": s["response"]}) + "\n" for s in DUMP[8:]))
    proc = run(str(dump), str(bare), "--examples", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert (report["rows"], report["agree"], report["disagree"], report["errors"]) == (12, 4, 7, 1)
    assert report["verdicts"] == {"both_correct": 2, "both_wrong": 2, "gsm8k_only": 4, "math_verify_only": 3}
    assert report["by_source"] == {"arithmetic_sub": {"math_verify_only": 1},
                                   "openai/gsm8k": {"both_correct": 2, "both_wrong": 2, "gsm8k_only": 4,
                                                    "math_verify_only": 2}}
    classes = {c["class"]: c for c in report["classes"]}
    assert {name: c["count"] for name, c in classes.items()} == {
        "gsm8k_only: #### marker": 2, "gsm8k_only: no answer for math_verify": 1,
        "gsm8k_only: comma between digits": 1, "math_verify_only: \\boxed{}": 1,
        "math_verify_only: expression with an operator": 1, "math_verify_only: percent": 1}
    assert report["classes"][0]["class"] == "gsm8k_only: #### marker"          # the most frequent first
    assert classes["gsm8k_only: #### marker"]["examples"] == [
        {"ground_truth": "72", "gsm8k_answer": "72", "math_verify_answer": "5", "response_end": "#### 72\nThe 5 friends"}]
    assert classes["gsm8k_only: comma between digits"]["examples"][0]["math_verify_answer"] == "3.4"
    assert classes["math_verify_only: expression with an operator"]["examples"][0]["gsm8k_answer"] == "-5"
    assert classes["gsm8k_only: no answer for math_verify"]["examples"][0]["math_verify_answer"] is None
    assert report["error_examples"][0]["message"].startswith("gsm8k: the data row has no reward_model.ground_truth")


def test_usage_errors_exit_2_with_one_line(tmp_path):
    proc = run(str(tmp_path / "missing.jsonl"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'missing.jsonl'} does not exist; give the jsonl that `nanoverl-train eval --samples` wrote"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "?"}\n')
    proc = run(str(bad))
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {bad}:1 has no \"response\" text")
    assert "Traceback" not in proc.stderr


def test_rollout_dumps_get_their_data_row_from_the_prompt_they_contain(tmp_path):
    """A run's rollouts/step_<N>.jsonl rows (rendered prompt, response, no ground truth) are matched to the data
    row whose last user message their prompt contains, the one found last (a few-shot example earlier is not it)."""
    data = tmp_path / "data.jsonl"
    rows = [{"data_source": "arithmetic_add", "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
             "reward_model": {"ground_truth": str(a + b)}} for a, b in ((2, 3), (4, 4), (9, 1))]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    template = "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n5<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    dump = tmp_path / "step_1.jsonl"
    lines = [(template.format("What is 4 + 4?"), "4 + 4 = 8"), (template.format("What is 9 + 1?"), "9 + 1"),
             (template.format("What is 9 + 1?"), "It is 9 + 1 = 11"),
             ("user: What is 7 + 7?", "14")]                             # in no data row: no ground truth, an error
    dump.write_text("".join(json.dumps({"uid": "u", "prompt": q, "response": r, "score": 0.0, "advantage": 0.0}) + "\n"
                            for q, r in lines))
    proc = run(str(dump), "--data", str(data))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert (report["rows"], report["errors"]) == (4, 1)
    assert report["verdicts"] == {"both_correct": 1, "both_wrong": 1, "gsm8k_only": 0, "math_verify_only": 1}
    (echo,) = report["classes"]                                          # math_verify evaluates the restated question
    assert echo["class"] == "math_verify_only: expression with an operator"
    assert echo["examples"] == [{"ground_truth": "10", "gsm8k_answer": "1", "math_verify_answer": "9 + 1",
                                 "response_end": "9 + 1"}]
