"""nanoverl-hf: Hugging Face workers (policy, reference, value) and an HF `generate` rollout.

Registered names: worker `hf`, rollout `hf`, reward `gsm8k`. Modules import transformers only when a
name is selected, so `nanoverl-train plugins` stays cheap.
"""

__version__ = "0.4.0"
