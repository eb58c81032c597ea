"""The arithmetic task: the generator's counts, split and determinism, and the reward on written responses.

    pytest examples/arithmetic
"""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[0] / "data" / "arithmetic"
TOOL_DATA = DATA.with_name("arithmetic_tool")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"arithmetic_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_data, reward = _load("make_data"), _load("reward")
arithmetic = reward.arithmetic


def read(name: str, folder: Path = DATA) -> list[dict]:
    return [json.loads(line) for line in (folder / name).read_text().splitlines()]


def triple(row: dict) -> tuple[int, str, int]:
    x = row["extra_info"]
    return x["a"], x["op"], x["b"]


def test_counts_and_balance():
    train, val = read("train.jsonl"), read("val.jsonl")
    assert (len(train), len(val)) == (236, 64)
    assert Counter(triple(r)[1] for r in val) == {"+": 22, "-": 21, "*": 21}
    assert Counter(triple(r)[1] for r in train) == {"+": 78, "-": 79, "*": 79}


def test_the_split_covers_all_300_problems_once_and_is_disjoint():
    train, val = {triple(r) for r in read("train.jsonl")}, {triple(r) for r in read("val.jsonl")}
    assert len(train) == 236 and len(val) == 64 and not train & val
    assert train | val == {(a, op, b) for a in range(10) for op in "+-*" for b in range(10)}


def test_rows_are_chat_format_with_the_right_answer():
    rows = read("train.jsonl") + read("val.jsonl")
    results = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}
    names = {"+": "arithmetic_add", "-": "arithmetic_sub", "*": "arithmetic_mul"}
    for row in rows:
        a, op, b = triple(row)
        assert row == {"data_source": names[op],
                       "prompt": [{"role": "user", "content": f"What is {a} {op} {b}?"}],
                       "reward_model": {"ground_truth": str(results[op](a, b))},
                       "extra_info": {"a": a, "b": b, "op": op}}
    assert make_data.make_row(3, "+", 4)["reward_model"] == {"ground_truth": "7"}
    assert make_data.make_row(0, "-", 9)["reward_model"] == {"ground_truth": "-9"}
    assert make_data.make_row(9, "*", 9)["reward_model"] == {"ground_truth": "81"}


def test_the_generator_reproduces_the_committed_files_byte_for_byte(tmp_path):
    assert make_data.files() == make_data.files()
    for name, text in make_data.files().items():
        assert (DATA / name).read_bytes() == text.encode(), name
    assert make_data.main(["--check"]) == 0
    assert make_data.main(["--out", str(tmp_path)]) == 0
    assert all((tmp_path / n).read_bytes() == (DATA / n).read_bytes() for n in ("train.jsonl", "val.jsonl"))
    (tmp_path / "val.jsonl").write_text("")
    assert make_data.main(["--check", "--out", str(tmp_path)]) == 1
    assert make_data.files(seed=1) != make_data.files()  # the seed matters: it is the split


def test_the_two_digit_task_is_disjoint_balanced_and_reproduced(tmp_path):
    train, val = read("train.jsonl", TOOL_DATA), read("val.jsonl", TOOL_DATA)
    assert Counter(triple(r)[1] for r in val) == {"+": 32, "-": 32, "*": 32}
    assert Counter(triple(r)[1] for r in train) == {"+": 400, "-": 400, "*": 400}
    triples = {triple(r) for r in train}, {triple(r) for r in val}
    demo = set(make_data.DEMO_PROBLEMS)
    assert len(triples[0]) == 1200 and len(triples[1]) == 96 and not triples[0] & triples[1]
    assert not (triples[0] | triples[1]) & demo                      # the solved examples are never asked
    assert all(10 <= a <= 99 and 10 <= b <= 99 for a, _, b in triples[0] | triples[1])
    row = val[0]
    a, op, b = triple(row)
    assert row["prompt"][:-1] == make_data.demo_messages() and row["prompt"][-1]["content"] == f"What is {a} {op} {b}?"
    assert row["prompt"][1]["content"] == ('<tool_call>{"name": "calculate", "arguments": {"expression": "23 * 41"}}'
                                           "</tool_call>") and row["prompt"][2] == {"role": "tool", "content": "943"}
    assert make_data.main(["--task", "two_digit", "--check"]) == 0
    assert make_data.main(["--task", "two_digit", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "val.jsonl").read_bytes() == (TOOL_DATA / "val.jsonl").read_bytes()


def test_the_demo_styles_differ_only_in_the_examples_answers():
    equation, answer = make_data.demo_messages("equation"), make_data.demo_messages("answer")
    assert [m["content"] for m in equation[3::4]] == ["23 * 41 = 943", "57 - 88 = -31"]
    assert [m["content"] for m in answer[3::4]] == ["The answer is 943.", "The answer is -31."]
    assert equation[:3] == answer[:3] and make_data.demo_messages("none") == []
    rows = make_data.files("two_digit", demo="none")["val.jsonl"].splitlines()
    assert json.loads(rows[0])["prompt"] == [{"role": "user", "content": "What is 10 + 27?"}]


def test_the_demo_results_are_the_calculators():
    from nanoverl_core.builtins.environments import calculate
    messages = make_data.demo_messages()
    for call, result in zip(messages[1::4], messages[2::4]):
        expression = json.loads(call["content"].removeprefix("<tool_call>").removesuffix("</tool_call>"))
        assert calculate(**expression["arguments"]) == result["content"]


def truth(value: str) -> dict:
    return {"reward_model": {"ground_truth": value}}


@pytest.mark.parametrize("response, gt, score", [
    ("The answer is 12.", "12", 1.0),            # a full stop is not a decimal point
    ("12", "12", 1.0),
    ("3 - 5 = -2", "-2", 1.0),
    ("3 - 5 = -2", "2", 0.0),
    ("=-2", "-2", 1.0),
    ("\u22122", "-2", 1.0),                       # the Unicode minus
    ("9-3", "-3", 0.0),                           # a minus right after a digit is a subtraction
    ("9-3", "3", 1.0),
    ("- 2", "-2", 0.0),                           # a minus with a space after it is not a sign
    ("no number", "0", 0.0),
    ("", "0", 0.0),
    ("7 then 8", "8", 1.0),                       # only the last integer counts
    ("7 then 8", "7", 0.0),
    ("1,000", "1000", 1.0),                       # a comma before exactly three digits groups thousands
    ("1,000", "0", 0.0),                          # ... so "1,000" does not answer "What is 0 * 7?"
    ("7,8", "8", 1.0),                            # otherwise a comma separates numbers
    ("3.5", "5", 0.0),                            # a decimal is not an integer
    ("7.0", "7", 1.0),
    ("So 9 * 9 = 81", "81", 1.0),
    ("What is 3 + 4? 7", "7", 1.0),
    ("7 apples", "7", 1.0),
    ("The answer is 0", "0", 1.0),
])
def test_reward_on_written_responses(response, gt, score):
    assert arithmetic("", response, truth(gt)) == score


def test_the_generated_rows_score_their_own_answer():
    for row in read("train.jsonl") + read("val.jsonl"):
        answer = row["reward_model"]["ground_truth"]
        assert arithmetic(row["prompt"][0]["content"], f"The answer is {answer}.", row) == 1.0
        assert arithmetic("", f"The answer is {int(answer) + 1}.", row) == 0.0


def test_a_row_without_an_integer_ground_truth_is_a_reward_error():
    from nanoverl_core import RewardError
    with pytest.raises(RewardError, match="no ground truth"):
        arithmetic("", "7", {"question": "3 + 4?"})
    with pytest.raises(RewardError, match="not an integer"):
        arithmetic("", "7", truth("seven"))
    assert arithmetic("", "7", {"target": "7"}) == 1.0


def test_the_files_load_through_the_core_data_path():
    from nanoverl_core.config import DataConfig
    from nanoverl_core.data import load_prompts

    class ChatTokenizer:  # whitespace tokens and a role-tag chat template: enough for the data path
        pad_token_id, eos_token_id, chat_template = 0, 1, "role-tags"

        def encode(self, text, add_special_tokens=True):
            return [2 + len(w) for w in text.split()]

        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
            return " ".join(f"<{m['role']}> {m['content']}" for m in messages) + " <assistant>"

    ds = load_prompts([str(DATA / "val.jsonl")], DataConfig(max_prompt_length=64), ChatTokenizer())
    assert len(ds) == 64 and ds.num_filtered == 0
    assert ds.texts[0] == "<user> What is 0 + 5? <assistant>"
    assert ds.rows[0]["reward_model"]["ground_truth"] == "5" and ds.rows[0]["extra_info"]["op"] == "+"


def test_the_trainer_loads_it_as_a_reward_file():
    from nanoverl_core.config import RewardConfig
    from nanoverl_core.plugins import Registry
    from nanoverl_core.reward import load_reward_fn
    fn, label = load_reward_fn(RewardConfig(file=str(HERE / "reward.py"), function="arithmetic"), Registry())
    assert fn("", "3 + 4 = 7", truth("7")) == 1.0 and label.endswith("reward.py:arithmetic")


def test_the_agent_data_are_the_two_digit_problems_without_examples():
    """examples/data/arithmetic_agent (the agent recipe's rows): `--demo none`'s files, the question alone."""
    agent = DATA.with_name("arithmetic_agent")
    assert make_data.main(["--task", "two_digit", "--demo", "none", "--check", "--out", str(agent)]) == 0
    rows = [json.loads(line) for line in (agent / "val.jsonl").read_text().splitlines()]
    tool = [json.loads(line) for line in (TOOL_DATA / "val.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == [t["prompt"][-1:] for t in tool]


def test_the_worded_agent_data_ask_the_same_problems_half_in_words():
    """examples/data/arithmetic_agent_worded: `--worded`'s files. The same problems and answers as
    arithmetic_agent, about half the training questions in WORDINGS' phrasings, the held-out rows unchanged
    (tests/test_fresh_problems.py: none of those phrasings is one that fresh_problems.py evaluates with)."""
    worded, plain = DATA.with_name("arithmetic_agent_worded"), DATA.with_name("arithmetic_agent")
    assert make_data.main(["--task", "two_digit", "--demo", "none", "--worded", "--check", "--out", str(worded)]) == 0
    assert (worded / "val.jsonl").read_bytes() == (plain / "val.jsonl").read_bytes()
    rows = [json.loads(line) for line in (worded / "train.jsonl").read_text().splitlines()]
    base = [json.loads(line) for line in (plain / "train.jsonl").read_text().splitlines()]
    assert [(r["extra_info"], r["reward_model"]) for r in rows] == [(r["extra_info"], r["reward_model"]) for r in base]
    changed = [(r, b) for r, b in zip(rows, base) if r["prompt"] != b["prompt"]]
    assert 0.45 < len(changed) / len(rows) < 0.55
    used = Counter()
    for r, _ in changed:
        info = r["extra_info"]
        phrasing = [w for w in make_data.WORDINGS[info["op"]] if w.format(**info) == r["prompt"][0]["content"]]
        assert len(phrasing) == 1
        used[phrasing[0]] += 1
    assert len(used) == 12 and min(used.values()) > 20


def test_worded_is_for_the_two_digit_task(capsys):
    with pytest.raises(SystemExit) as exit_:
        make_data.main(["--worded"])
    assert exit_.value.code == 2 and capsys.readouterr().err.startswith("error: --worded")
