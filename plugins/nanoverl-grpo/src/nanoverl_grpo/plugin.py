"""Hook implementations of nanoverl-grpo: lazy "module:attr" strings only."""

from nanoverl_core import hookimpl


@hookimpl
def register_advantage_estimators(register):
    est = "nanoverl_grpo.estimators"
    register("grpo", f"{est}:grpo",
             description="group mean baseline divided by the group std (algorithm.norm_adv_by_std_in_grpo)")
    register("dr_grpo", f"{est}:dr_grpo",
             description="group mean baseline, no std division; pair with actor.loss_agg_mode=seq-mean-token-sum-norm")
    register("rloo", f"{est}:rloo", description="leave-one-out group mean baseline")
    register("reinforce_plus_plus_baseline", f"{est}:reinforce_plus_plus_baseline",
             description="group mean baseline, then whitened over the batch's tokens")
    register("opo", f"{est}:opo", description="length-weighted group mean baseline (on-policy optimal baseline)")
    register("grpo_passk", f"{est}:grpo_passk",
             description="pass@k: only each group's best response gets r_max - r_second (needs rollout.n >= 2)")
