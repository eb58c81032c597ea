"""nanoverl-tensorboard: the ``tensorboard`` tracker (``tracking.trackers = [..., "tensorboard"]``)."""

__version__ = "0.4.0"
