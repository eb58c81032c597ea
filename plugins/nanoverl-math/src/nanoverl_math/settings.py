"""Settings of the `math_verify` reward, written as [reward.math_verify].

Kept apart from the reward (no math-verify or sympy import), so checking a config stays fast and a
config names its keys even where math-verify is not installed.
"""

from __future__ import annotations

from typing import Literal

import attrs

from nanoverl_core.config import at_least, finite


def _dotted_path(_instance, attribute, value: str) -> None:
    if value and any(not part for part in value.split(".")):
        raise ValueError(f"'{attribute.name}' = {value!r} is not a dotted path of row fields "
                         "(e.g. reward_model.ground_truth); leave it empty for the usual fields")


@attrs.define
class MathVerifySettings:
    ground_truth_key: str = attrs.field(default="", validator=_dotted_path)
    """The row field holding the gold answer, a dotted path into nested fields ("reward_model.ground_truth");
    empty: the first present of reward_model.ground_truth, ground_truth, target, answer (as the other rewards).
    A gold answer with "####" (GSM8K's worked solution) is read after its last "####"."""
    gold_format: Literal["latex", "expr"] = "latex"
    """How the gold answer is parsed: "latex" (as verl's math_verify scorer: wrapped in \\boxed{} unless it
    holds one or a $, then read with LatexExtractionConfig: "\\frac{1}{2}", "1,000", "72") or "expr" (a plain
    expression with ExprExtractionConfig: "1/2", "0.5"). The response is always read with both."""
    correct: float = attrs.field(default=1.0, validator=finite())
    """The score when the response's answer equals the gold answer."""
    wrong: float = attrs.field(default=0.0, validator=finite())
    """The score when the response has an answer and it differs from the gold one."""
    no_answer: float = attrs.field(default=0.0, validator=finite())
    """The score when math-verify finds no answer in the response at all (reward/answer_found counts these)."""
    timeout_s: int = attrs.field(default=5, validator=at_least(0))
    """math-verify's own time limit in whole seconds for each parse and each comparison (SIGALRM; 0: none).
    Used only where a signal can work: the main thread of a process with no other alarm armed (a reward
    worker process; the trainer with reward.workers = 0 and reward.timeout_s = 0); elsewhere it is off and
    reward.timeout_s (the pool kills the worker) is the limit. A parse that runs out counts as no answer, a
    comparison that runs out as wrong."""
