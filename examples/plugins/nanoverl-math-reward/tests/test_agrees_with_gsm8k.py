"""`math_answer` against nanoverl-hf's `gsm8k` reward: where they agree, and where they differ on purpose.

"Agree" means the same verdict: `gsm8k` scores 1.0 exactly when `math_answer` scores more than 0
(`math_answer` pays 0.9 for a correct answer that is only the last number; `gsm8k` pays 1.0). The
`gsm8k` reward is pure Python: it is imported from nanoverl-hf when installed, else loaded from this
checkout's plugins/nanoverl-hf/src, so these tests run in every test environment.
"""

import importlib.util
import sys
from importlib.util import find_spec
from pathlib import Path

if find_spec("nanoverl_math_reward") is None:  # run from a checkout without installing: use ../src
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import pytest

from nanoverl_math_reward.rewards import math_answer

REPO = Path(__file__).resolve().parents[4]
GSM8K_TEST = REPO / "examples" / "data" / "gsm8k" / "test.parquet"


def _load_gsm8k():
    try:
        from nanoverl_hf.rewards import gsm8k
    except ImportError:
        path = REPO / "plugins" / "nanoverl-hf" / "src" / "nanoverl_hf" / "rewards.py"
        spec = importlib.util.spec_from_file_location("_nanoverl_hf_rewards_for_test", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        gsm8k = module.gsm8k
    return gsm8k


gsm8k = _load_gsm8k()


def both(response: str, truth: str) -> tuple[float, float]:
    row = {"reward_model": {"ground_truth": truth}}
    return gsm8k("", response, row)["score"], math_answer("", response, row)["score"]


def agree(response: str, truth: str) -> bool:
    g, m = both(response, truth)
    return (g == 1.0) == (m > 0)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    import pyarrow.parquet as pq
    return pq.read_table(GSM8K_TEST, columns=["reward_model", "extra_info"]).to_pylist()


def test_they_agree_on_every_worked_test_answer_and_its_variants(rows):
    assert len(rows) == 1319
    disagree = {}
    for row in rows:
        worked, truth = row["extra_info"]["answer"], row["reward_model"]["ground_truth"]
        body, final = worked.rsplit("####", 1)
        assert both(worked, truth) == (1.0, 1.0), row["extra_info"]["index"]
        variants = {"wrong": f"{body}#### {int(truth) + 1}", "boxed": body + "\\boxed{" + final.strip() + "}",
                    "said": f"{body}So the answer is {final.strip()}.", "body only": body,
                    "wrong then box": f"{body}#### {int(truth) + 1} \\boxed{{{truth}}}"}
        for name, response in variants.items():
            if not agree(response, truth):
                disagree.setdefault(name, []).append(row["extra_info"]["index"])
    # The one disagreement: a body ending "... and 1/3 pound walnuts." (truth 3). gsm8k's last number is
    # the 3 of "1/3" (right by luck), math_answer reads the fraction 1/3.
    assert disagree == {"body only": [659]}
    assert rows[659]["extra_info"]["answer"].rsplit("####", 1)[0].rstrip().endswith("1/3 pound walnuts.")


@pytest.mark.parametrize("response, truth, scores", [
    ("1,600", "1600", (1.0, 0.9)),                 # unformatted: math_answer pays the format penalty
    ("$1600.00", "1600", (1.0, 0.9)),
    ("-3", "-3", (1.0, 0.9)),
    ("\\boxed{5}", "5", (1.0, 1.0)),
    ("#### 5.", "5", (1.0, 1.0)),
    ("#### $1,600.00", "1600", (1.0, 1.0)),
    ("#### -12", "-12", (1.0, 1.0)),
    ("answer 3 then 4", "4", (1.0, 0.9)),          # the last number
    ("answer 3 then 4", "3", (0.0, 0.0)),
    ("#### 5 \\boxed{6}", "5", (1.0, 1.0)),         # #### wins over \boxed{}, wherever each stands
    ("#### 5 \\boxed{6}", "6", (0.0, 0.0)),
    ("\\boxed{6} #### 5", "5", (1.0, 1.0)),
    ("#### The answer\nis 5", "5", (1.0, 1.0)),     # the first number after ####, on any line
    ("#### five\n2+3=5", "5", (0.0, 0.0)),          # ... which is the 2
    ("2+2=4 #### four", "4", (1.0, 0.9)),           # no number after ####: the last number before it
    ("#### \n", "5", (0.0, 0.0)),
    ("", "5", (0.0, 0.0)),
    ("I do not know", "5", (0.0, 0.0)),
    ("2(3)", "3", (1.0, 0.9)),
    ("\\boxed{1600 \\text{ dollars}}", "1600", (1.0, 1.0)),
    ("\\boxed{16", "16", (1.0, 0.9)),                # cut off inside the box: the last number
    ("-$5", "-5", (1.0, 0.9)),
    ("5%", "5", (1.0, 0.9)),
    ("#### 1,600,000", "1600000", (1.0, 1.0)),
])
def test_edge_strings_where_they_agree(response, truth, scores):
    assert both(response, truth) == scores


# A minus followed by a space is a bullet or an operator, not a sign, in both scorers.
@pytest.mark.parametrize("response, truth", [("Total:\n- 5", "5"), ("Total:\n- 5", "-5"), ("so 10 - 5", "5")])
def test_a_minus_followed_by_a_space_is_not_a_sign_in_either(response, truth):
    assert agree(response, truth)


@pytest.mark.parametrize("response, truth, scores", [
    ("#### 24/2", "12", (0.0, 1.0)),              # math_answer: a/b is one number, a fraction
    ("#### 24/2", "24", (1.0, 0.0)),
    ("#### 5/0", "5", (1.0, 0.0)),
    ("\\boxed{\\frac{3200}{2}}", "1600", (0.0, 1.0)),   # gsm8k skips a box with nested braces
    ("\\boxed{18 \\text{ dollars}}. Check: 9 * 2", "18", (0.0, 1.0)),   # ... and takes the last number, 2
    ("3,4", "34", (1.0, 0.0)),                    # math_answer: a comma groups exactly three digits
    ("1,60", "160", (1.0, 0.0)),
    ("1,6000", "16000", (1.0, 0.0)),
])
def test_edge_strings_where_they_differ_on_purpose(response, truth, scores):
    assert both(response, truth) == scores


def test_the_format_keys_differ_on_purpose():
    row = {"reward_model": {"ground_truth": "5"}}
    assert gsm8k("", "\\boxed{5}", row) == {"score": 1.0, "formatted": 0.0}   # gsm8k: only #### is the format
    assert math_answer("", "\\boxed{5}", row) == {"score": 1.0, "format_ok": 1.0, "answer_found": 1.0}
