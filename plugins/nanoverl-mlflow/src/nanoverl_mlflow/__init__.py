"""nanoverl-mlflow: the ``mlflow`` tracker (``tracking.trackers = [..., "mlflow"]``)."""

__version__ = "0.4.0"
