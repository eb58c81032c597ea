"""Reward of the arithmetic task: 1.0 when the last integer in the response equals the result, else 0.0.

Pure Python (no torch). Use it by file until it is registered by name:

    reward.file = "examples/arithmetic/reward.py"
    reward.function = "arithmetic"

How the last integer is read (pinned in test_arithmetic.py):
  * a minus sign belongs to the number when it stands right before the digits and not right after
    a digit: "3 - 5 = -2" and "=-2" end in -2, "9-3" is 9 and 3 (a subtraction, not -3), "- 2" is 2
    (a markdown bullet, not a sign). The Unicode minus "−" counts as a minus too;
  * a comma between digits is a thousands separator when exactly three digits follow it: "1,000" is
    one thousand (not 1 and 000, which would pay "What is 0 * 7?"); otherwise it separates numbers,
    "7,8" ends in 8;
  * a decimal part makes a number that is not an integer: "3.5" ends in 3.5 and pays nothing for a
    result of 5, "7.0" is 7; a sentence's full stop ("The answer is 12.") is not a decimal point;
  * only the last number counts: "7 then 8" answers 8, and "no number" scores 0.
The ground truth is the row's reward_model.ground_truth (else ground_truth, target or answer), an
integer such as "-2".
"""

from __future__ import annotations

import re
from decimal import Decimal

from nanoverl_core.errors import RewardError

GROUND_TRUTH_KEYS = ("reward_model.ground_truth", "ground_truth", "target", "answer")
_NUMBER = re.compile(r"(?:(?<!\d)[-\u2212])?\d+(?:,\d{3}(?!\d))*(?:\.\d+)?")


def last_number(response: str) -> Decimal | None:
    """The value of the last number in `response` ("-2", "1,000", "3.5"), or None if there is none."""
    numbers = _NUMBER.findall(response)
    if not numbers:
        return None
    return Decimal(numbers[-1].replace("\u2212", "-").replace(",", ""))


def _ground_truth(sample: dict) -> int:
    for key in GROUND_TRUTH_KEYS:
        node = sample
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            try:
                return int(str(node).strip())
            except ValueError:
                raise RewardError(f"arithmetic: the ground truth {node!r} is not an integer") from None
    raise RewardError(f"arithmetic: the data row has no ground truth; add one of {', '.join(GROUND_TRUTH_KEYS)}")


def arithmetic(prompt: str, response: str, sample: dict) -> float:
    """1.0 if the last integer in the response equals the row's ground truth, else 0.0."""
    truth = _ground_truth(sample)
    answer = last_number(response)
    return float(answer is not None and answer == truth)
