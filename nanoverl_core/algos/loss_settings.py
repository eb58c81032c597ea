"""[actor.<loss>]: the built-in policy losses' own settings (no torch import: checking a config stays fast).

Defaults are the published ones: verl 0.9.1's example recipe for the loss where it has one (CISPO,
GMPO, DPPO), otherwise verl's config defaults. The token ratio r = pi / pi_old; `vanilla`, `gspo` and
`clip_cov` read their PPO clip range from [actor] (`clip_ratio_low`, `clip_ratio_high`).
"""

import attrs

from ..config import above, at_least, between, finite
from ..config.domains import not_below

_non_negative = at_least(0)
_positive = above(0)
_fraction = between(0, 1, low_open=True)


@attrs.define
class CispoSettings:
    eps_low: float = attrs.field(default=10.0, validator=_non_negative)
    """The detached IS weight is at least 1 - eps_low; the default 10 sets no lower bound, as MiniMax-M1
    and verl's CISPO example do."""
    eps_high: float = attrs.field(default=0.2, validator=_positive)
    """The detached IS weight is at most 1 + eps_high."""


@attrs.define
class SapoSettings:
    tau_pos: float = attrs.field(default=1.0, validator=_positive)
    """Temperature of the soft gate for tokens with a positive advantage (larger: a sharper gate)."""
    tau_neg: float = attrs.field(default=1.05, validator=_positive)
    """Temperature for tokens with advantage <= 0; above tau_pos, negative updates fade faster off-policy."""


@attrs.define
class GeoMeanSettings:
    clip_low: float = attrs.field(default=0.4, validator=_non_negative)
    """Token log-ratios are clipped below at -clip_low (the ratio at e^-clip_low) before the geometric mean."""
    clip_high: float = attrs.field(default=0.4, validator=_non_negative)
    """Token log-ratios are clipped above at clip_high (the ratio at e^clip_high)."""


@attrs.define
class ClipCovSettings:
    ratio: float = attrs.field(default=0.0002, validator=_fraction)
    """Fraction of the micro-batch's valid tokens whose gradient is detached (at least one token)."""
    lower_bound: float = attrs.field(default=1.0, validator=finite())
    """Only tokens whose covariance (A - mean A)(log pi - mean log pi) is above this are candidates."""
    upper_bound: float = attrs.field(default=5.0, validator=[finite(), not_below("lower_bound")])
    """... and below this."""


@attrs.define
class KlCovSettings:
    ratio: float = attrs.field(default=0.0002, validator=_fraction)
    """Fraction of the micro-batch's valid tokens (the largest covariances, at least one) that get the penalty."""
    coef: float = attrs.field(default=0.1, validator=_non_negative)
    """Weight of the |log r| penalty on those tokens (verl's ppo_kl_coef)."""


def _required(instance, attribute, value) -> None:
    if value is None:
        raise ValueError(f"'{attribute.name}' must be set to a number > 0 (it has no default)")


@attrs.define
class DroSettings:
    beta: float | None = attrs.field(default=None, validator=[_required, above(0, optional=True)])
    """Weight of the quadratic penalty 0.5 * beta * (log r)^2 that keeps the policy near the sampling one;
    required (verl has no default either)."""


@attrs.define
class DppoTvSettings:
    delta_low: float = attrs.field(default=0.15, validator=_non_negative)
    """Trust region for A <= 0: a token whose probability fell by more than this (pi_old - pi) gets no gradient."""
    delta_high: float = attrs.field(default=0.15, validator=_non_negative)
    """Trust region for A > 0: a token whose probability rose by more than this (pi - pi_old) gets no gradient."""
    is_cap: float = attrs.field(default=20.0, validator=_positive)
    """The detached IS weight is truncated at this: large, so the truncation bias stays small (verl's code
    default; its DPPO example turns the truncation off with 10000)."""


@attrs.define
class DppoKlSettings:
    delta_low: float = attrs.field(default=0.05, validator=_non_negative)
    """Trust region for A <= 0: a token whose probability fell and whose binary KL(old || new) exceeds this gets
    no gradient."""
    delta_high: float = attrs.field(default=0.05, validator=_non_negative)
    """Trust region for A > 0: a token whose probability rose and whose binary KL exceeds this gets no gradient."""
    is_cap: float = attrs.field(default=20.0, validator=_positive)
    """The detached IS weight is truncated at this."""
