"""Example nanoverl plugin: the rewards `math_answer` and `math_answer_strict` (see rewards.py)."""
