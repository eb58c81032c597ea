"""Hook implementations of nanoverl-math: lazy "module:attr" strings only."""

from nanoverl_core import hookimpl


@hookimpl
def register_rewards(register):
    register("math_verify", "nanoverl_math.rewards:math_verify", settings="nanoverl_math.settings:MathVerifySettings",
             description="math-verify's parse + verify of the response against the ground truth: boxed, LaTeX, "
                         "fractions, units ([reward.math_verify] scores, gold_format, timeout_s)")
