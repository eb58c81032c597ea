"""[tracking.mlflow]: where the mlflow tracker logs (no mlflow import: checking a config stays fast)."""

import attrs


@attrs.define
class MlflowSettings:
    uri: str = ""
    """The tracking store; empty: $MLFLOW_TRACKING_URI if set, else the embedded local store (sqlite next
    to the runs)."""
    experiment: str = "nanoverl"
    """The MLflow experiment the run is logged in (created if missing)."""
    run_name: str = ""
    """The MLflow run's name; empty: the run directory's name."""
