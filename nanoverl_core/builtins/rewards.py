"""Basic rewards against a ground-truth field of the dataset row."""

from __future__ import annotations

from typing import Any

from ..errors import RewardError

GROUND_TRUTH_KEYS = ("reward_model.ground_truth", "ground_truth", "target", "answer")


def ground_truth(sample: dict[str, Any]) -> str:
    """The row's ground truth: the first of GROUND_TRUTH_KEYS (dotted paths) that is present."""
    for key in GROUND_TRUTH_KEYS:
        node: Any = sample
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return str(node)
    raise RewardError(f"the data row has no ground truth; add one of the fields {', '.join(GROUND_TRUTH_KEYS)}")


def exact_match(prompt: str, response: str, sample: dict) -> float:
    return float(response.strip() == ground_truth(sample).strip())


def char_match(prompt: str, response: str, sample: dict) -> float:
    """Partial credit: matching characters position by position over the longer of the two strings."""
    target, response = ground_truth(sample).strip(), response.strip()
    hits = sum(a == b for a, b in zip(response, target))
    return hits / max(len(target), len(response), 1)
