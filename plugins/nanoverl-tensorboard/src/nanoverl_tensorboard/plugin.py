"""Hook implementations: lazy strings only, so listing plugins imports neither torch nor tensorboard."""

from nanoverl_core import hookimpl


@hookimpl
def register_trackers(register):
    register("tensorboard", "nanoverl_tensorboard.tracker:make_tracker",
             settings="nanoverl_tensorboard.settings:TensorBoardSettings",
             description="TensorBoard event files (nanoverl[tensorboard]; [tracking.tensorboard] log_dir, "
                         "flush_secs, max_sample_rows)")
