"""The gsm8k reward on real GSM8K rows and on the formats models write."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from nanoverl_core import RewardError
from nanoverl_hf.rewards import extract_answer, gsm8k, normalize_number

REPO = Path(__file__).resolve().parents[3]
GSM8K_TEST = REPO / "examples" / "data" / "gsm8k" / "test.parquet"  # the copy shipped in the repository


@pytest.fixture(scope="module")
def rows():
    import datasets
    datasets.disable_progress_bars()
    return list(datasets.load_dataset("parquet", data_files=str(GSM8K_TEST), split="train").select(range(300)))


def test_the_reference_solutions_score_1_and_wrong_answers_0(rows):
    for row in rows:
        solution = row["extra_info"]["answer"]                 # worked answer ending in "#### 1,600"
        assert gsm8k("", solution, row) == {"score": 1.0, "formatted": 1.0}, solution[-40:]
        wrong = solution.rsplit("####", 1)[0] + f"#### {int(row['reward_model']['ground_truth']) + 1}"
        assert gsm8k("", wrong, row)["score"] == 0.0
        assert gsm8k("", "I do not know.", row) == {"score": 0.0, "formatted": 0.0}


def test_commas_in_real_answers_are_covered(rows):
    assert any("," in row["extra_info"]["answer"].rsplit("####", 1)[1] for row in rows)


SAMPLE = {"reward_model": {"ground_truth": "1600"}}


@pytest.mark.parametrize("response, score, formatted", [
    ("so the total is 1600\n#### 1600", 1.0, 1.0),
    ("#### $1,600.00", 1.0, 1.0),
    ("#### 1600.", 1.0, 1.0),
    ("####1600 dollars", 1.0, 1.0),
    ("First 800, then 1600. #### 1601", 0.0, 1.0),        # "####" wins over the numbers before it
    ("The answer is \\boxed{1,600}. Check: 2 * 800", 1.0, 0.0),
    ("He pays 2 * 800 = 1600 dollars.", 1.0, 0.0),        # fallback: the last number
    ("He pays 1600 dollars, 2 times", 0.0, 0.0),          # the last number is 2
    ("#### \n", 0.0, 0.0),                                # an empty marker: no answer after it, none before
    ("", 0.0, 0.0),
])
def test_answer_formats(response, score, formatted):
    assert gsm8k("", response, SAMPLE) == {"score": score, "formatted": formatted}


def test_numbers_compare_as_values():
    assert normalize_number("$1,234.50") == Decimal("1234.5") == normalize_number("1234.500")
    assert normalize_number("-7") == Decimal(-7) and normalize_number("no digits") is None
    assert extract_answer("a 3 b #### -12") == (Decimal(-12), True)
    assert gsm8k("", "#### -12", {"reward_model": {"ground_truth": "-12"}})["score"] == 1.0


def test_a_row_without_ground_truth_is_a_reward_error():
    with pytest.raises(RewardError, match="reward_model.ground_truth"):
        gsm8k("", "#### 3", {"question": "?"})
