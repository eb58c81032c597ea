"""Hook implementations of nanoverl-batch-baseline: a lazy "module:attr" string, so listing stays cheap."""

from nanoverl_core import hookimpl


@hookimpl
def register_advantage_estimators(register):
    register("batch_mean_baseline", "nanoverl_batch_baseline.estimator:batch_mean_baseline",
             description="REINFORCE, leave-one-out batch-mean baseline (algorithm.params.group_weight)")
