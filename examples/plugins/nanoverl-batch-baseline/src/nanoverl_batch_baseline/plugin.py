"""Hook implementations of nanoverl-batch-baseline: a lazy "module:attr" string, so listing stays cheap."""

from nanoverl_core import hookimpl


@hookimpl
def register_advantage_estimators(register):
    register("batch_mean_baseline", "nanoverl_batch_baseline.estimator:batch_mean_baseline",
             settings="nanoverl_batch_baseline.settings:BatchBaselineSettings",
             description="REINFORCE, leave-one-out batch-mean baseline ([algorithm.batch_mean_baseline] group_weight)")
