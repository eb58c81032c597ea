"""[tracking.mlflow]: where the mlflow tracker logs (no mlflow import: checking a config stays fast)."""

import re

import attrs

SCHEMES = ("file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc")
"""The tracking-store URI schemes mlflow serves (a plain path is a file store)."""


def _store_uri(instance, attribute, value: str) -> None:
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", value)
    if scheme and scheme.group(1).partition("+")[0].lower() not in SCHEMES:
        import difflib
        close = difflib.get_close_matches(scheme.group(1).lower(), SCHEMES, n=1, cutoff=0.5)
        raise ValueError(f"the scheme {scheme.group(1)!r}:// is no tracking store mlflow serves "
                         f"({', '.join(SCHEMES)}){f'; did you mean {close[0]!r}?' if close else ''}")


@attrs.define
class MlflowSettings:
    uri: str = attrs.field(default="", validator=_store_uri)
    """The tracking store (a URI of one of SCHEMES: sqlite:///runs/mlflow.db, http://host:5000, or a path);
    empty: $MLFLOW_TRACKING_URI if set, else the embedded local store (sqlite next
    to the runs)."""
    experiment: str = "nanoverl"
    """The MLflow experiment the run is logged in (created if missing)."""
    run_name: str = ""
    """The MLflow run's name; empty: the run directory's name."""
