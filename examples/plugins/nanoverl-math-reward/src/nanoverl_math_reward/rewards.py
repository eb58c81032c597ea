"""A final-answer reward for GSM8K- and MATH-style data, with a format check.

The final answer is looked for in this order (the first place that gives one wins):

  1. after the last "####" (GSM8K's convention): the first number after it, or, when the ground truth
     is not a number, the rest of that line;
  2. inside the last \\boxed{...} (MATH's; nested braces are fine): its first number, or its text;
  3. otherwise the last number anywhere in the response; this one pays a small format penalty:

    correct answer after #### or in \\boxed{}          1.0
    correct answer, only as the last number              1.0 - FORMAT_PENALTY  (math_answer_strict: 0)
    wrong answer, or no answer                           0.0

Numbers compare as exact fractions: "1,600", "$1600", "1600.00", "1600." and "\\frac{3200}{2}" all
equal 1600. A comma is a thousands separator only before exactly three digits ("1,600" is 1600; "3,4"
is the two numbers 3 and 4). A ground truth that is not a number (MATH's "\\sqrt{2}") compares as
text after removing spaces, "$", "\\left", "\\right" and "\\!": there is no symbolic equivalence.

The dict's extra keys are logged as reward/format_ok (the answer came from #### or \\boxed{}) and
reward/answer_found (any answer was found), so a run shows how fast the format is learned.

On GSM8K rows this agrees with nanoverl-hf's `gsm8k` reward on which answers are correct (the same
order of places, the same "first number after ####"), except where it differs on purpose
(pinned in tests/test_agrees_with_gsm8k.py, listed in the README):
  * a correct answer found only as the last number scores 0.9 here, 1.0 in `gsm8k`; and `format_ok`
    counts \\boxed{} as formatted, `gsm8k`'s `formatted` counts only ####;
  * "a/b" and "\\frac{a}{b}" are one number (a fraction) here, two numbers in `gsm8k`;
  * "- 5" (a space after the minus: a markdown bullet, "10 - 5") is 5 here, -5 in `gsm8k` 0.1.0;
  * commas only group thousands here: "3,4" / "1,60" are two numbers, `gsm8k` reads 34 / 160;
  * a \\boxed{} with nested braces is read here, `gsm8k` skips it (and falls back to the last number).
"""

from __future__ import annotations

import re
from fractions import Fraction

from nanoverl_core import RewardError

FORMAT_PENALTY = 0.1
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?")  # 12, -3.5, 3/4


def _clean(text: str) -> str:
    """Drop what never changes a value: thousands commas, $, %, LaTeX spacing and \\frac{a}{b} -> a/b.
    A bracket between two digits becomes a space ("2(3)" stays two numbers, not 23)."""
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)
    text = re.sub(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", text)
    text = re.sub(r"(?<=\d)[(){}]+(?=\d)", " ", text)
    for junk in ("\\$", "$", "\\%", "%", "\\left", "\\right", "\\!", "\\,", "{", "}", "(", ")"):
        text = text.replace(junk, "")
    return text


def parse_number(text: str) -> Fraction | None:
    """The first number in `text` as an exact fraction ('$1,234.50' -> 2469/2), or None."""
    match = _NUMBER.search(_clean(text))
    if match is None:
        return None
    numerator, _, denominator = match.group().replace(" ", "").partition("/")
    try:
        return Fraction(numerator) / Fraction(denominator or "1")
    except ZeroDivisionError:
        return None


def is_number(text: str) -> bool:
    """Whether `text` is one number ("1,600", "$5", "-3.5", "\\frac{3}{4}"), as opposed to MATH-style text."""
    return _NUMBER.fullmatch(_clean(text).strip()) is not None


def _first_number(text: str) -> str | None:
    match = _NUMBER.search(_clean(text))
    return match.group() if match else None


def _last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...}, braces balanced; None if there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None  # unbalanced: the response was cut off inside the box


def final_answer(response: str, numeric: bool = True) -> tuple[str | None, bool]:
    """(the answer text, whether it was formatted); see the module docstring for the order. `numeric`:
    the ground truth is a number, so only numbers count as answers; (None, False) when there is none."""
    if "####" in response:
        rest = response.rsplit("####", 1)[1]
        answer = _first_number(rest) if numeric else rest.strip().split("\n", 1)[0].strip()
        if answer:
            return answer, True
    boxed = _last_boxed(response)
    if boxed is not None:
        answer = _first_number(boxed) if numeric else boxed.strip()
        if answer:
            return answer, True
    numbers = _NUMBER.findall(_clean(response))
    return (numbers[-1] if numbers else None), False


def _text_key(text: str) -> str:
    """A non-numeric answer as compared: no spaces, $, \\left, \\right, \\! or trailing '.'; \\dfrac -> \\frac."""
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for junk in ("$", "\\left", "\\right", "\\!", "\\,", " "):
        text = text.replace(junk, "")
    return text.rstrip(".")


def same_answer(answer: str, truth: str) -> bool:
    """Numeric equality when the ground truth is a number, else equality of the normalised text."""
    expected = parse_number(truth) if is_number(truth) else None
    if expected is not None:
        return parse_number(answer) == expected
    return _text_key(answer) == _text_key(truth)


GROUND_TRUTH_KEYS = ("reward_model.ground_truth", "ground_truth", "target", "answer")


def ground_truth(sample: dict) -> str:
    """The first of GROUND_TRUTH_KEYS (dotted paths) in the row; a worked "... #### x" gives x."""
    for key in GROUND_TRUTH_KEYS:
        node = sample
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            truth = str(node)
            return truth.rsplit("####", 1)[1].strip() if "####" in truth else truth.strip()
    raise RewardError(f"math_answer: the data row has no ground truth; add one of {', '.join(GROUND_TRUTH_KEYS)}")


def math_answer(prompt: str, response: str, sample: dict, *, format_penalty: float = FORMAT_PENALTY) -> dict:
    """{"score", "format_ok", "answer_found"}; see the module docstring for the scores."""
    truth = ground_truth(sample)
    answer, formatted = final_answer(response, numeric=is_number(truth))
    correct = answer is not None and same_answer(answer, truth)
    score = (1.0 if formatted else 1.0 - format_penalty) if correct else 0.0
    return {"score": score, "format_ok": float(formatted), "answer_found": float(answer is not None)}


def math_answer_strict(prompt: str, response: str, sample: dict) -> dict:
    """math_answer with no credit for an answer outside #### or \\boxed{}."""
    return math_answer(prompt, response, sample, format_penalty=1.0)
