"""Hook implementations of nanoverl-code: lazy "module:attr" strings only."""

from nanoverl_core import hookimpl


@hookimpl
def register_rewards(register):
    register("code", "nanoverl_code.rewards:code", settings="nanoverl_code.settings:CodeSettings",
             description="the response's program run against the row's test cases (stdin/stdout, call-based, "
                         "HumanEval, MBPP; verl's prime_code rows) in a namespace sandbox ([reward.code] sandbox, "
                         "score, cpu_s, wall_s, memory_mb, ...)")
