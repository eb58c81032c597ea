"""char_match that also appends "<pid> <data row index>" to $NANOVERL_TEST_SCORE_LOG: which process scored
which row (run with reward.workers=0, so the caller is the trainer process of its rank)."""

import os

from nanoverl_core.builtins.rewards import char_match


def compute_score(prompt: str, response: str, sample: dict) -> float:
    with open(os.environ["NANOVERL_TEST_SCORE_LOG"], "a") as log:
        log.write(f"{os.getpid()} {sample.get('index', prompt)}\n")
    return char_match(prompt, response, sample)
