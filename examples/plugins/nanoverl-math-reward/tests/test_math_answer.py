"""`math_answer` on hand-written responses and on real GSM8K rows.

The GSM8K rows come from the copy shipped in the repository, <repo>/examples/data/gsm8k/test.parquet.
"""

import sys
from importlib.util import find_spec
from pathlib import Path

if find_spec("nanoverl_math_reward") is None:  # run from a checkout without installing: use ../src
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import pytest

from nanoverl_core import RewardError
from nanoverl_core.plugins import Registry
from nanoverl_math_reward import plugin
from nanoverl_math_reward.rewards import math_answer, math_answer_strict, parse_number

REPO = Path(__file__).resolve().parents[4]
GSM8K = REPO / "examples" / "data" / "gsm8k" / "test.parquet"
ROW = {"reward_model": {"ground_truth": "1600"}}


def score(response, sample=ROW, fn=math_answer):
    return fn("", response, sample)


@pytest.mark.parametrize("text, value", [("1,600", 1600), ("$1600", 1600), ("1600.00", 1600), ("1600.", 1600),
                                         ("-3.5 apples", -3.5), ("\\frac{3}{4}", 0.75), ("\\$1,450,000", 1450000),
                                         ("3, 4", 3), ("3,4", 3), ("2(3)", 2), ("-\\frac{1}{2}", -0.5),
                                         ("none", None)])
def test_numbers_compare_as_values(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("response", ["so she pays 16 * 100 = 1600\n#### 1,600", "#### $1600.00",
                                      "The answer is \\boxed{1600}.", "\\boxed{\\$1,600}", "#### 1600\n(the end)",
                                      "first \\boxed{7}, on second thought #### 1600",
                                      "#### 1600 (not \\boxed{16})", "\\boxed{1600 \\text{ dollars}}"])
def test_a_correct_formatted_answer_scores_one(response):
    assert score(response) == {"score": 1.0, "format_ok": 1.0, "answer_found": 1.0}


def test_a_correct_unformatted_answer_pays_the_format_penalty():
    assert score("16 * 100 = 1600 dollars") == {"score": 0.9, "format_ok": 0.0, "answer_found": 1.0}
    assert score("16 * 100 = 1600 dollars", fn=math_answer_strict)["score"] == 0.0


@pytest.mark.parametrize("response, found", [("#### 1601", 1.0), ("\\boxed{160}", 1.0),
                                             ("#### 16, \\boxed{1600}", 1.0), ("it is 1500", 1.0),
                                             ("I do not know", 0.0), ("\\boxed{16", 1.0), ("#### sixteen", 0.0)])
def test_a_wrong_or_missing_answer_scores_zero(response, found):
    out = score(response)
    assert out["score"] == 0.0 and out["answer_found"] == found


def test_math_style_answers_compare_as_text_when_the_truth_is_not_a_number():
    row = {"ground_truth": "\\frac{\\sqrt{3}}{2}"}
    assert score("so \\boxed{\\dfrac{\\sqrt{3}}{2}}", row)["score"] == 1.0
    assert score("so \\boxed{\\sqrt{3}}", row)["score"] == 0.0
    assert score("#### \\sqrt{2}\n(the rest of that line only)", {"ground_truth": "\\sqrt{2}"})["score"] == 1.0
    assert score("\\boxed{\\frac{1}{2}}", {"ground_truth": "0.5"})["score"] == 1.0


def test_the_ground_truth_is_read_from_the_usual_columns():
    for row in [{"ground_truth": "7"}, {"target": "7"}, {"answer": "3 + 4 = 7\n#### 7"}]:
        assert score("#### 7", row)["score"] == 1.0, row
    with pytest.raises(RewardError, match="reward_model.ground_truth"):
        score("#### 7", {"question": "3 + 4?"})


def test_plugin_registers_both_names_lazily():
    registry = Registry()
    plugin.register_rewards(register=lambda name, obj, description="": registry.add("reward", name, obj, "test",
                                                                                     description))
    assert registry.names("reward") == ["math_answer", "math_answer_strict"]
    assert registry.get("reward", "math_answer") is math_answer


@pytest.fixture(scope="module")
def gsm8k_rows() -> list[dict]:
    import pyarrow.parquet as pq
    return pq.read_table(GSM8K, columns=["prompt", "reward_model", "extra_info"]).to_pylist()


def test_every_worked_gsm8k_answer_scores_one(gsm8k_rows):
    assert len(gsm8k_rows) > 1000  # the whole test split (1319 rows)
    for row in gsm8k_rows:
        out = math_answer(row["prompt"][0]["content"], row["extra_info"]["answer"], row)
        assert out == {"score": 1.0, "format_ok": 1.0, "answer_found": 1.0}, (row["extra_info"]["index"], out)


def test_a_wrong_final_answer_on_gsm8k_scores_zero(gsm8k_rows):
    for row in gsm8k_rows[:200]:
        worked = row["extra_info"]["answer"]
        body, final = worked.rsplit("####", 1)
        wrong = f"{body}#### {parse_number(final) + 1}"
        assert math_answer("", wrong, row)["score"] == 0.0, row["extra_info"]["index"]
        assert math_answer("", f"{body}#### ", row)["format_ok"] == 0.0  # empty answer: not formatted
