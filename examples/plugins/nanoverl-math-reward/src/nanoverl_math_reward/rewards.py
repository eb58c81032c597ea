"""A final-answer reward for GSM8K- and MATH-style data, with a format check.

The final answer is the text after the last "####" (to the end of that line; GSM8K's convention) or
inside the last \\boxed{...} (MATH's), whichever comes later. Without either, the last number in the
response is taken, and the score pays a small format penalty:

    correct answer after #### or in \\boxed{}          1.0
    correct answer, only as the last number              1.0 - FORMAT_PENALTY  (math_answer_strict: 0)
    wrong answer, or no answer                           0.0

Numbers compare as exact fractions: "1,600", "$1600", "1600.00", "1600." and "\\frac{3200}{2}" all
equal 1600. A ground truth that is not a number (MATH's "\\sqrt{2}") compares as text after removing
spaces, "$", "\\left", "\\right" and "\\!": there is no symbolic equivalence.

The dict's extra keys are logged as reward/format_ok (the answer used #### or \\boxed{}) and
reward/answer_found (any answer was found), so a run shows how fast the format is learned.
"""

from __future__ import annotations

import re
from fractions import Fraction

from nanoverl_core import RewardError

FORMAT_PENALTY = 0.1
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?")  # 12, -3.5, 3/4


def _clean(text: str) -> str:
    """Drop what never changes a value: thousands commas, $, %, LaTeX spacing and \\frac{a}{b} -> a/b."""
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)
    text = re.sub(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", text)
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


def _last_boxed(text: str) -> tuple[int, str] | None:
    """(position, content) of the last \\boxed{...}, braces balanced; None if there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return start, text[i + 1:j]
    return None  # unbalanced: the response was cut off inside the box


def final_answer(response: str) -> tuple[str | None, bool]:
    """(the answer text, whether it was formatted): after the last ####, in the last \\boxed{}, whichever
    comes later, else the last number (unformatted); (None, False) when there is no number at all."""
    candidates = []
    if "####" in response:
        at = response.rfind("####")
        candidates.append((at, response[at + 4:].strip().split("\n", 1)[0]))
    boxed = _last_boxed(response)
    if boxed is not None:
        candidates.append(boxed)
    if candidates:
        answer = max(candidates)[1].strip()
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
    expected = parse_number(truth) if _NUMBER.fullmatch(_clean(truth).strip()) else None
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
    answer, formatted = final_answer(response)
    correct = answer is not None and same_answer(answer, ground_truth(sample))
    score = (1.0 if formatted else 1.0 - format_penalty) if correct else 0.0
    return {"score": score, "format_ok": float(formatted), "answer_found": float(answer is not None)}


def math_answer_strict(prompt: str, response: str, sample: dict) -> dict:
    """math_answer with no credit for an answer outside #### or \\boxed{}."""
    return math_answer(prompt, response, sample, format_penalty=1.0)
