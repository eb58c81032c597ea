"""Example nanoverl plugin: the advantage estimator `batch_mean_baseline` (see estimator.py)."""
