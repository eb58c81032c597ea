"""Hook implementations: lazy strings only, so listing plugins imports neither torch nor mlflow."""

from nanoverl_core import hookimpl


@hookimpl
def register_trackers(register):
    register("mlflow", "nanoverl_mlflow.tracker:make_tracker", settings="nanoverl_mlflow.settings:MlflowSettings",
             description="MLflow tracking store (nanoverl[mlflow]; [tracking.mlflow] uri, experiment, run_name)")
