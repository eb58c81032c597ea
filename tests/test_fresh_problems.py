"""examples/agents/fresh_problems.py: problems the calculator agent's run never trained on, plain or reworded."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fresh_problems", ROOT / "examples" / "agents" / "fresh_problems.py")
fresh = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fresh)


def problem(row):
    return row["extra_info"]["a"], row["extra_info"]["op"], row["extra_info"]["b"]


def test_fresh_rows_are_new_distinct_right_and_repeatable():
    training = {problem(json.loads(line)) for line in fresh.TRAIN.read_text().splitlines()}
    rows = fresh.fresh_rows(seed=4242, n=300)
    assert len({problem(r) for r in rows}) == 300 and not {problem(r) for r in rows} & training
    assert [r["extra_info"]["op"] for r in rows[:6]] == ["+", "-", "*", "+", "-", "*"]
    for r in rows:
        a, op, b = problem(r)
        assert r["prompt"] == [{"role": "user", "content": f"What is {a} {op} {b}?"}]
        assert r["reward_model"]["ground_truth"] == str({"+": a + b, "-": a - b, "*": a * b}[op])
    assert fresh.fresh_rows(seed=4242, n=300) == rows and fresh.fresh_rows(seed=4243, n=300) != rows


def test_reworded_rows_ask_new_problems_in_other_words(tmp_path):
    out = tmp_path / "fresh.jsonl"
    fresh.main(["--seed", "7", "--n", "60", "--reworded", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    training = {problem(json.loads(line)) for line in fresh.TRAIN.read_text().splitlines()}
    assert len({problem(r) for r in rows}) == 60 and not {problem(r) for r in rows} & training
    assert rows == fresh.fresh_rows(seed=7, n=60, reworded=True)
    questions = [r["prompt"][0]["content"] for r in rows]
    assert not any(q.startswith("What is ") for q in questions)
    assert all(str(r["extra_info"]["a"]) in q and str(r["extra_info"]["b"]) in q for r, q in zip(rows, questions))
    assert len({q.split(str(r["extra_info"]["a"]))[0] for r, q in zip(rows, questions)}) > 6


def test_no_reworded_phrasing_is_one_the_worded_training_rows_use():
    """make_data.py --worded's WORDINGS (examples/data/arithmetic_agent_worded) and REWORDED are disjoint."""
    for op in "+-*":
        assert fresh.REWORDED[op] and not set(fresh.make_data.WORDINGS[op]) & set(fresh.REWORDED[op])
