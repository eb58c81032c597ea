"""The reward `reasoning_gym`: the task's own verifier (`dataset.score_answer(answer, entry)`) on the answer
reasoning_gym's `extract_answer` finds in the response. The item is regenerated from the row's reference
(task, params, seed, size, index), exactly the one the prompt was drawn from."""

from __future__ import annotations

from .settings import ReasoningGymRewardSettings
from .source import dataset_of


def score(prompt: str, response: str, sample: dict, settings: ReasoningGymRewardSettings | None = None) -> float:
    from reasoning_gym.utils import extract_answer

    tag = (settings or ReasoningGymRewardSettings()).answer_tag
    ref = sample.get("reasoning_gym")
    if not isinstance(ref, dict):
        raise ValueError("the row has no 'reasoning_gym' reference; reward.name = \"reasoning_gym\" scores rows of "
                         "data.source = \"reasoning_gym\"")
    dataset = dataset_of(ref)
    answer = extract_answer(response, tag_name=tag) if tag else response.strip()
    return float(dataset.score_answer(answer, dataset[ref["index"]]))
