"""Hook implementations: lazy strings only, so listing plugins does not import wandb."""

from nanoverl_core import hookimpl


@hookimpl
def register_trackers(register):
    register("wandb", "nanoverl_wandb.tracker:make_tracker", settings="nanoverl_wandb.settings:WandbSettings",
             description="Weights & Biases, offline by default (nanoverl[wandb]; [tracking.wandb] project, entity, "
                         "name, group, tags, mode, max_sample_rows)")
