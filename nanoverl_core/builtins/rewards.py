"""Basic rewards against a ground-truth field of the dataset row."""

from __future__ import annotations

from typing import Any

from ..reward.calls import ground_truth_value


def ground_truth(sample: dict[str, Any]) -> str:
    """The row's ground truth (reward.calls.GROUND_TRUTH_KEYS) as a string."""
    return str(ground_truth_value(sample))


def exact_match(prompt: str, response: str, sample: dict) -> float:
    return float(response.strip() == ground_truth(sample).strip())


def char_match(prompt: str, response: str, sample: dict) -> float:
    """Partial credit: matching characters position by position over the longer of the two strings."""
    target, response = ground_truth(sample).strip(), response.strip()
    hits = sum(a == b for a, b in zip(response, target))
    return hits / max(len(target), len(response), 1)
