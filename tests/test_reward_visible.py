"""A reward's detail is visible wherever it scores: the extra keys a reward returns (the code reward's
compile_error, wrong_answer, ...) are logged in training, and also in validation's metrics, `eval`'s table,
its --json and --samples, and per response in `nanoverl-train score`, which scores responses a user wrote
(to check a reward before a run) with no model loaded.
"""

from __future__ import annotations

import json

from conftest import EXAMPLES, assert_user_error, read_metrics, run_cli

REINFORCE = str(EXAMPLES / "debug_reinforce.toml")

DETAILED = '''
def compute_score(data_source, solution_str, ground_truth, extra_info):
    """1 for the target; the extra keys say why not."""
    answer, truth = solution_str.strip(), str(ground_truth).strip()
    if answer == "boom":
        raise ValueError("cannot score boom")
    return {"score": float(answer == truth), "empty": float(not answer), "too_long": float(len(answer) > len(truth))}
'''


def _reward(tmp_path):
    reward = tmp_path / "detailed.py"
    reward.write_text(DETAILED)
    return [f"reward.file={reward}", "reward.name="]


def test_validation_and_eval_show_every_extra_key_of_the_reward(tmp_path):
    run_dir = tmp_path / "run"
    base = ["--config", REINFORCE, *_reward(tmp_path), f"trainer.output_dir={run_dir}", "trainer.progress=none",
            "tracking.trackers=[jsonl]"]
    proc = run_cli(*base, "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = read_metrics(run_dir)[-1]
    for key in ("reward/empty", "reward/too_long"):
        assert key in last and f"val/{key}" in last, sorted(last)
    assert "val/rollout/truncated_frac" in last

    samples = tmp_path / "samples.jsonl"
    proc = run_cli("eval", *base, "--checkpoint", "step_2", "--json", "--samples", str(samples), "rollout.val_n=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)["results"]
    for metrics in results.values():
        assert {"reward/empty", "reward/too_long", "rollout/truncated_frac"} <= metrics.keys(), sorted(metrics)
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert rows and all(set(row["extras"]) == {"reward/empty", "reward/too_long"} for row in rows)
    greedy = [r for r in rows if r["decoding"] == "greedy"]
    assert sum(r["extras"]["reward/too_long"] for r in greedy) / len(greedy) == results["greedy"]["reward/too_long"]

    table = run_cli("eval", *base, "--checkpoint", "step_2")
    assert table.returncode == 0, table.stderr[-3000:]
    assert f"greedy     reward/too_long: {results['greedy']['reward/too_long']:.4f}" in table.stdout, table.stdout


def test_score_prints_each_responses_score_and_extra_keys(tmp_path):
    """`nanoverl-train score --config F --responses FILE.jsonl`: rows of the data's shape with a response each
    (or `eval --samples` lines); a failed call scores 0 and says why in its row; nothing is trained or loaded."""
    responses = tmp_path / "responses.jsonl"
    responses.write_text("".join(json.dumps(row) + "\n" for row in [
        {"prompt": "123=", "target": "123", "response": "123"},
        {"prompt": "123=", "target": "123", "response": "1234"},
        {"prompt": "456=", "target": "456", "response": ""},
        {"prompt": "456=", "target": "456", "response": "boom"},
    ]))
    proc = run_cli("score", "--config", REINFORCE, *_reward(tmp_path), "--responses", str(responses), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert [r["score"] for r in report["rows"]] == [1.0, 0.0, 0.0, 0.0]
    assert [r.get("extras") for r in report["rows"]] == [
        {"reward/empty": 0.0, "reward/too_long": 0.0}, {"reward/empty": 0.0, "reward/too_long": 1.0},
        {"reward/empty": 1.0, "reward/too_long": 0.0}, None]
    assert "cannot score boom" in report["rows"][3]["error"]
    assert report["metrics"]["reward/mean"] == 0.25 and report["metrics"]["reward/errors"] == 1.0

    text = run_cli("score", "--config", REINFORCE, *_reward(tmp_path), "--responses", str(responses))
    assert text.returncode == 0, text.stderr[-3000:]
    lines = text.stdout.splitlines()
    assert lines[2].split() == ["0", "1.0000", "empty=0", "too_long=0"]
    assert lines[3].split() == ["1", "0.0000", "empty=0", "too_long=1"]
    assert lines[5] == "    3   0.0000    error: raised ValueError: cannot score boom"

    registered = run_cli("score", "--config", REINFORCE, "--responses", str(responses), "--json")  # char_match
    assert [r["score"] for r in json.loads(registered.stdout)["rows"]] == [1.0, 0.75, 0.0, 0.0]


def test_score_refuses_a_file_that_is_not_responses_with_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1=", "target": "1"}\n')
    assert_user_error(run_cli("score", "--config", REINFORCE, "--responses", str(bad)),
                      f"{bad}:1 has no \"response\" text")
    assert_user_error(run_cli("score", "--config", REINFORCE, "--responses", str(tmp_path / "none.jsonl")),
                      "does not exist")
