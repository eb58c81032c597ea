"""nanoverl-math: the `math_verify` reward, Hugging Face's math-verify behind nanoverl's reward contract.

Registered names: reward `math_verify` (settings `[reward.math_verify]`). math-verify (and sympy) is
imported only when the name is selected, so `nanoverl-train plugins` stays cheap.
"""

__version__ = "0.4.0"
