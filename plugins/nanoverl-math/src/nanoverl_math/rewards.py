"""The `math_verify` reward: Hugging Face's math-verify (`parse` + `verify`) behind nanoverl's reward contract.

    [reward]
    name = "math_verify"

    [reward.math_verify]            # all optional (nanoverl_math/settings.py)
    ground_truth_key = ""           # "": reward_model.ground_truth, ground_truth, target or answer
    gold_format = "latex"           # or "expr"
    correct = 1.0
    wrong = 0.0
    no_answer = 0.0
    timeout_s = 5                   # math-verify's own limit per parse / comparison (0: none)

The response is parsed with math-verify's defaults (LaTeX and plain expressions, anchors such as "the
answer is" or a \\boxed{} preferred, else the last expression), so "\\boxed{\\frac{1}{2}}", "0.5", "1/2",
"$1,000", "1000 dollars" and "#### 72" all give a value; units, "$" and thousands separators are stripped
as math-verify does. The gold answer is parsed as `gold_format` says, and `verify(gold, answer)` decides
(numbers compare to 6 decimals; expressions symbolically). It returns {"score", "answer_found"}; the
second is logged as reward/answer_found.

Timeouts. math-verify bounds each parse and each comparison with SIGALRM (`parsing_timeout`,
`timeout_seconds`), which works only in a process's main thread, and whose `alarm(0)` on return would
cancel any other alarm the process armed. So its limit (`timeout_s`) is passed only when this call runs
in the main thread and no ITIMER_REAL alarm is armed: in nanoverl's reward worker processes (the
default; each call runs in the worker's main thread, and the pool's own limit, reward.timeout_s, kills
the worker from outside) and in the trainer with reward.workers = 0 and reward.timeout_s = 0. Anywhere
else (another thread; the trainer's own SIGALRM for reward.timeout_s armed) it passes None and
reward.timeout_s is the only limit. A parse that math-verify times out counts as no answer, a
comparison as wrong: math-verify returns them as such, not as errors.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from nanoverl_core.config import settings_or_defaults
from nanoverl_core.errors import RewardError
from nanoverl_core.reward import ground_truth_value

from .settings import MathVerifySettings

GOLD_CONFIGS = {"latex": [LatexExtractionConfig()], "expr": [ExprExtractionConfig()]}


def _not_the_disabled_timeout_warning(record: logging.LogRecord) -> bool:
    """math-verify warns once that its timeout is off when given None; here the pool's limit holds instead."""
    return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_not_the_disabled_timeout_warning)


def signal_timeout(seconds: int) -> int | None:
    """`seconds` where math-verify's SIGALRM timeout can work here (the main thread, no alarm armed), else None."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        return None
    return None if signal.getitimer(signal.ITIMER_REAL)[0] > 0 else seconds


def gold_text(sample: dict[str, Any], key: str) -> str:
    """The row's gold answer as text: the field `key` (dotted), or the usual ground-truth fields; a GSM8K
    worked solution ("... #### 72") gives what follows its last "####"."""
    if key:
        node: Any = sample
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            raise RewardError(f"math_verify: the data row has no field {key!r} "
                              "([reward.math_verify] ground_truth_key); fix the key or the data")
    else:
        node = ground_truth_value(sample)
    text = str(node)
    return text.rsplit("####", 1)[1].strip() if "####" in text else text.strip()


def parse_gold(text: str, gold_format: str, timeout: int | None) -> list:
    """math-verify's parse of a gold answer: "latex" wraps it in \\boxed{} unless it holds a \\boxed or a $."""
    if gold_format == "latex" and "\\boxed" not in text and "$" not in text:
        text = "\\boxed{" + text + "}"
    return parse(text, GOLD_CONFIGS[gold_format], parsing_timeout=timeout)


def math_verify(prompt: str, response: str, sample: dict, settings: MathVerifySettings | None = None
                ) -> dict[str, float]:
    """settings.correct / wrong / no_answer for `response` against the row's gold answer (see the module doc)."""
    settings = settings_or_defaults(settings, MathVerifySettings)
    timeout = signal_timeout(settings.timeout_s)
    truth = gold_text(sample, settings.ground_truth_key)
    gold = parse_gold(truth, settings.gold_format, timeout)
    if not gold:
        other = "expr" if settings.gold_format == "latex" else "latex"
        raise RewardError(f"math_verify: the ground truth {truth!r} gives no answer when parsed as "
                          f"{settings.gold_format}; set [reward.math_verify] gold_format = \"{other}\" or fix the row")
    answer = parse(response, parsing_timeout=timeout)
    if not answer:
        return {"score": settings.no_answer, "answer_found": 0.0}
    right = verify(gold, answer, timeout_seconds=timeout)
    return {"score": settings.correct if right else settings.wrong, "answer_found": 1.0}
