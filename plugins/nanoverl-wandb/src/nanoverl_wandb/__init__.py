"""nanoverl-wandb: the ``wandb`` tracker (``tracking.trackers = [..., "wandb"]``)."""

__version__ = "0.4.0"
