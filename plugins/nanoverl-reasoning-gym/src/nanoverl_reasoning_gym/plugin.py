"""Hook implementations only: lazy strings, so listing plugins imports neither reasoning_gym nor torch."""

from nanoverl_core import hookimpl

_HERE = "nanoverl_reasoning_gym"


@hookimpl
def register_data_sources(register):
    register("reasoning_gym", f"{_HERE}.source:make_source", settings=f"{_HERE}.settings:ReasoningGymSettings",
             description="Reasoning Gym task generators: a weighted mix of tasks, fresh rows every epoch "
                         "([data.reasoning_gym] tasks, size, seed, val_size, val_seed, system_prompt)")


@hookimpl
def register_rewards(register):
    register("reasoning_gym", f"{_HERE}.reward:score", settings=f"{_HERE}.settings:ReasoningGymRewardSettings",
             description="the task's own Reasoning Gym verifier on the answer in <answer> tags "
                         "([reward.reasoning_gym] answer_tag)")
