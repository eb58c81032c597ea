"""Hook implementations of nanoverl-grpo: lazy "module:attr" strings only."""

from nanoverl_core import hookimpl


@hookimpl
def register_advantage_estimators(register):
    est, settings = "nanoverl_grpo.estimators", "nanoverl_grpo.settings:GroupNormSettings"
    otb_settings = "nanoverl_grpo.settings:OptimalTokenBaselineSettings"
    register("grpo", f"{est}:grpo", settings=settings,
             description="group mean baseline divided by the group std ([algorithm.grpo] norm_by_std, epsilon)")
    register("dr_grpo", f"{est}:dr_grpo",
             description="group mean baseline, no std division; pair with actor.loss_agg_mode=seq-mean-token-sum-norm")
    register("rloo", f"{est}:rloo", description="leave-one-out group mean baseline")
    register("reinforce_plus_plus_baseline", f"{est}:reinforce_plus_plus_baseline",
             description="group mean baseline, then whitened over the batch's tokens")
    register("opo", f"{est}:opo", description="length-weighted group mean baseline (on-policy optimal baseline)")
    register("grpo_passk", f"{est}:grpo_passk", settings=settings,
             description="pass@k: only each group's best response gets r_max - r_second (needs rollout.n >= 2)")
    register("gdpo", f"{est}:gdpo", settings=settings,
             description="each [[reward.components]] reward normalised in its group, then weighted, summed, whitened")
    register("gpg", f"{est}:gpg", description="group mean baseline times batch size / rows with a non-zero score (GPG)")
    register("optimal_token_baseline", f"{est}:optimal_token_baseline", settings=otb_settings,
             description="per-token group baseline weighted by the path variance (needs the actor's sum of pi^2)")
    register("remax", f"{est}:remax",
             description="reward-to-go minus the score of one greedy response per prompt (ReMax; a greedy rollout a step)")
