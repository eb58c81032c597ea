"""[rollout.hf]: the hf rollout's own settings (no torch or transformers import: checking a config stays fast)."""

import attrs


@attrs.define
class HFRolloutSettings:
    share_prompts: bool = True
    """Prefill each distinct prompt of a generate call once and copy its KV cache to the rows that repeat
    it (the n samples of a prompt); false: a plain generate over every row. An engine with its own prefix
    cache (vLLM) needs no such key, so it is the hf rollout's, not a [rollout] key."""
