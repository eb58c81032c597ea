"""Hook implementations only: lazy strings, so listing plugins imports neither verifiers nor torch."""

from nanoverl_core import hookimpl

_HERE = "nanoverl_verifiers"


@hookimpl
def register_agents(register):
    register("verifiers", f"{_HERE}.agent:run_environment", settings=f"{_HERE}.settings:VerifiersSettings",
             description="a verifiers environment's own rollout per row, scored by its rubric "
                         "([agent.verifiers] env_id, env_args, sampling_args)")


@hookimpl
def register_data_sources(register):
    register("verifiers", f"{_HERE}.source:make_source", settings=f"{_HERE}.settings:VerifiersDataSettings",
             description="the rows of the [agent.verifiers] environment's own dataset (train) and eval_dataset "
                         "(val) ([data.verifiers] train_examples, val_examples)")
