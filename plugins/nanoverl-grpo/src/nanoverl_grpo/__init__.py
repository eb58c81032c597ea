"""nanoverl-grpo: group-relative advantage estimators for nanoverl (see estimators.py)."""

__version__ = "0.4.0"
