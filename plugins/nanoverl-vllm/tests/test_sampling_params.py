"""How nanoverl's SamplingParams become vLLM's (no engine needed, but vLLM must import)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from nanoverl_core import SamplingParams  # noqa: E402
from nanoverl_vllm.rollout import to_vllm_params  # noqa: E402


def test_sampling_knobs_map_one_to_one():
    p = to_vllm_params(SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.9, top_k=5),
                       stop_token_ids=[2, 9], seed=123, log_probs=True)
    assert (p.n, p.temperature, p.top_p, p.top_k, p.max_tokens) == (1, 0.7, 0.9, 5, 6)
    assert p.stop_token_ids == [2, 9] and p.seed == 123
    assert p.logprobs == 0                    # the sampled token's log-prob only
    assert p.detokenize is False              # token ids in, token ids out
    assert p.repetition_penalty == 1.0 and p.min_p == 0.0 and p.min_tokens == 0


def test_top_k_0_disables_top_k_and_full_nucleus_is_off():
    p = to_vllm_params(SamplingParams(max_new_tokens=4), stop_token_ids=[2], seed=1, log_probs=False)
    assert p.top_k in (0, -1) and p.top_p == 1.0 and p.temperature == 1.0
    assert p.logprobs is None


def test_temperature_0_is_greedy_without_a_seed():
    p = to_vllm_params(SamplingParams(max_new_tokens=4, temperature=0.0, top_p=0.5, top_k=3),
                       stop_token_ids=[2], seed=99, log_probs=True)
    assert p.temperature == 0.0 and p.top_p == 1.0 and p.top_k in (0, -1) and p.seed is None
    assert p.max_tokens == 4 and p.stop_token_ids == [2]
