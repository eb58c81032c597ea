"""[rollout.hf]: the hf rollout's own settings (no torch or transformers import: checking a config stays fast)."""

import attrs


@attrs.define
class HFRolloutSettings:
    share_prompts: bool = True
    """Prefill each distinct prompt of a generate call once and copy its KV cache to the rows that repeat
    it (the n samples of a prompt); false: a plain generate over every row. An engine with its own prefix
    cache (vLLM) needs no such key, so it is the hf rollout's, not a [rollout] key."""
    turn_cache: bool = True
    """Keep each multi-turn episode's KV cache from one turn to the next and prefill only the new tokens
    (rollout.py). In float32 the ids are those of prefilling the whole conversation every turn; under bf16
    the kept keys and values round differently from a whole prefill's, so the samples differ (as they do
    when only the batch's rows change): false prefills every turn whole."""
