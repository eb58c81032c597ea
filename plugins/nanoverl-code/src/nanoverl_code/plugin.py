"""Hook implementations of nanoverl-code: lazy "module:attr" strings only."""

from nanoverl_core import hookimpl


@hookimpl
def register_rewards(register):
    register("code", "nanoverl_code.rewards:code", settings="nanoverl_code.settings:CodeSettings",
             description="the response's program run against the row's test cases (stdin/stdout, call-based, "
                         "HumanEval, MBPP; verl's prime_code rows) in a namespace sandbox ([reward.code] sandbox, "
                         "score, cpu_s, wall_s, memory_mb, ...)")


@hookimpl
def register_data_sources(register):
    register("code_tasks", "nanoverl_code.source:make_source", settings="nanoverl_code.settings:CodeTasksSettings",
             description="generated programming tasks (small Python functions) with call-based test cases for the "
                         "code reward, fresh rows every epoch ([data.code_tasks] difficulty, tasks, size, seed, "
                         "val_size, val_seed, tests)")
