"""Hook implementations of nanoverl-math-reward: lazy "module:attr" strings, so listing stays cheap."""

from nanoverl_core import hookimpl


@hookimpl
def register_rewards(register):
    register("math_answer", "nanoverl_math_reward.rewards:math_answer",
             description="final answer after #### or in \\boxed{} vs the ground truth; 0.1 off if unformatted")
    register("math_answer_strict", "nanoverl_math_reward.rewards:math_answer_strict",
             description="math_answer that only accepts answers after #### or in \\boxed{}")
