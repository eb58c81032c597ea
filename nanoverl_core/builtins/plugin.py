"""The core's own hook implementations: lazy strings only, so listing plugins imports nothing heavy."""

from ..hookspecs import hookimpl

_HERE = "nanoverl_core.builtins"


@hookimpl
def register_rollouts(register):
    register("debug", f"{_HERE}.debug:make_rollout", settings=f"{_HERE}.debug_settings:DebugRolloutSettings",
             description="token-by-token sampling with the debug worker's tiny model ([rollout.debug] log_probs)")


@hookimpl
def register_workers(register):
    register("debug", f"{_HERE}.debug:make_workers", settings=f"{_HERE}.debug_settings:DebugModelSettings",
             description="tiny pure-torch transformer over a character vocabulary ([worker.debug] sizes)")


@hookimpl
def register_advantage_estimators(register):
    register("gae", "nanoverl_core.algos.advantages:gae", description="generalised advantage estimation (needs a critic)")
    register("reinforce_plus_plus", "nanoverl_core.algos.advantages:reinforce_plus_plus",
             description="discounted returns, whitened over the batch")
    register("distill", "nanoverl_core.algos.distill:distill", settings="nanoverl_core.algos.distill_settings:DistillSettings",
             description="on-policy distillation: per-token log teacher - log student ([teacher], [algorithm.distill])")


@hookimpl
def register_rewards(register):
    register("exact_match", f"{_HERE}.rewards:exact_match", description="1 if the stripped response equals the ground truth")
    register("char_match", f"{_HERE}.rewards:char_match", description="fraction of positions matching the ground truth")


@hookimpl
def register_trackers(register):
    register("console", f"{_HERE}.trackers:ConsoleTracker", description="progress bar or one log line per step")
    register("jsonl", f"{_HERE}.trackers:JsonlTracker", description="metrics.jsonl in the run directory")
    register("plot", f"{_HERE}.plot_tracker:make_tracker", settings=f"{_HERE}.plot_tracker:PlotSettings",
             description="metrics.png in the run directory: reward, validation, entropy, response length")


@hookimpl
def register_policy_losses(register):
    losses = "nanoverl_core.algos.losses"
    register("vanilla", f"{losses}:vanilla", description="token-level PPO clip with clip-higher and dual clip")
    register("gspo", f"{losses}:gspo", description="sequence-level ratio, the geometric mean of token ratios (GSPO)")
    more, settings = "nanoverl_core.algos.policy_losses", "nanoverl_core.algos.loss_settings"
    register("cispo", f"{more}:cispo", settings=f"{settings}:CispoSettings",
             description="CISPO: clipped, detached IS weight times A times log-prob ([actor.cispo])")
    register("sapo", f"{more}:sapo", settings=f"{settings}:SapoSettings",
             description="SAPO: a soft sigmoid gate on the ratio instead of a clip ([actor.sapo])")
    register("geo_mean", f"{more}:geo_mean", settings=f"{settings}:GeoMeanSettings",
             description="GMPO: per sequence, the geometric mean of log-clipped token ratios ([actor.geo_mean])")
    register("gpg", f"{more}:gpg", description="GPG: plain policy gradient, -A log-prob per token (no ratio, no clip)")
    register("clip_cov", f"{more}:clip_cov", settings=f"{settings}:ClipCovSettings",
             description="Clip-Cov: PPO clip, and a few high-covariance tokens detached ([actor.clip_cov])")
    register("kl_cov", f"{more}:kl_cov", settings=f"{settings}:KlCovSettings",
             description="KL-Cov: unclipped ratio, |log r| penalty on the highest-covariance tokens ([actor.kl_cov])")
    register("dro", f"{more}:dro", settings=f"{settings}:DroSettings",
             description="DRO: -A log-prob plus a quadratic log-ratio penalty ([actor.dro] beta, required)")
    register("dppo_tv", f"{more}:dppo_tv", settings=f"{settings}:DppoTvSettings",
             description="DPPO-Binary-TV: no gradient where the token's probability moved too far ([actor.dppo_tv])")
    register("dppo_kl", f"{more}:dppo_kl", settings=f"{settings}:DppoKlSettings",
             description="DPPO-Binary-KL: no gradient where the token's binary KL is too large ([actor.dppo_kl])")


@hookimpl
def register_environments(register):
    register("copy_turns", f"{_HERE}.environments:copy_turns", settings=f"{_HERE}.debug_settings:CopyTurnsSettings",
             description="the copy task answered a few characters per turn (multi-turn twin of char_match)")
    register("calculator", f"{_HERE}.environments:calculator",
             description="one tool, calculate(expression), for integer arithmetic; [reward] scores the answer")


@hookimpl
def register_data_sources(register):
    register("files", "nanoverl_core.data:FileSource",
             description="data.train_files and data.val_files (jsonl / json / parquet), the same rows every epoch")
