"""GSM8K reward (pure Python: no transformers, no torch).

The answer is read from the response in this order:
  1. the number after the last "####" (the format the GSM8K prompts ask for);
  2. otherwise the number in the last \\boxed{...} (what many instruct models write);
  3. otherwise the last number anywhere in the response.
The fallbacks score answers a model gives in its own format, so a small model is rewarded for the
arithmetic before it learns the "####" convention; `reward/formatted` (1 when "####" was used) shows
how far the format has been learned. Numbers compare as values: "1,600", "$1600", "1600.00" and
"1600." all equal 1600.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from nanoverl_core.errors import RewardError

_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")  # a sign touches its digits: "- 5" (a bullet) is 5
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def normalize_number(text: str) -> Decimal | None:
    """'$1,234.50' -> Decimal('1234.5'); None when `text` holds no number."""
    match = _NUMBER.search(text)
    if match is None:
        return None
    cleaned = re.sub(r"[\s$,]", "", match.group())
    try:
        return Decimal(cleaned).normalize()
    except InvalidOperation:
        return None


def extract_answer(response: str) -> tuple[Decimal | None, bool]:
    """(the answer, whether it came from the "####" marker); see the module docstring for the order."""
    if "####" in response:
        value = normalize_number(response.rsplit("####", 1)[1])
        if value is not None:
            return value, True
    boxed = _BOXED.findall(response)
    if boxed:
        value = normalize_number(boxed[-1])
        if value is not None:
            return value, False
    numbers = _NUMBER.findall(response)
    return (normalize_number(numbers[-1]) if numbers else None), False


def _ground_truth(sample: dict[str, Any]) -> str:
    node = sample.get("reward_model")
    truth = node.get("ground_truth") if isinstance(node, dict) else sample.get("ground_truth")
    if truth is None:
        raise RewardError("gsm8k: the data row has no reward_model.ground_truth (nor ground_truth); "
                          "use the GSM8K parquet layout or add that field")
    return str(truth)


def gsm8k(prompt: str, response: str, sample: dict) -> dict[str, float]:
    """1.0 if the response's final answer equals the ground truth numerically, else 0.0."""
    truth = normalize_number(_ground_truth(sample))
    if truth is None:
        raise RewardError(f"gsm8k: ground truth {_ground_truth(sample)!r} is not a number")
    answer, formatted = extract_answer(response)
    return {"score": float(answer is not None and answer == truth), "formatted": float(formatted)}
