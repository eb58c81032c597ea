"""Every registered component's settings, drawn across and beyond their declared domains: `--dry-run` either
accepts the values, and then a one-step run on the debug backends starts, or refuses them with one line.

The registry is walked (`load_registry()`, each kind's `settings_class`): a component a plugin adds is drawn
too. A number is drawn at, inside and just outside its domain (`domain_of`: bounds, open ends, multiples),
plus NaN, inf and a huge value; a bool, a Literal and a string from their own values and wrong ones. Only
components that run on the debug worker (the core's and nanoverl-grpo's) get the one-step run; the others
(vllm, hf, fsdp, ...) are checked by the dry-run alone. Profile "ci" of test_config_fuzz.py: a fixed seed
and a bounded number of examples, about a minute and a half on 2 cores.
"""

from __future__ import annotations

import math
import typing

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_config_fuzz import PROFILE, REINFORCE, SCALE, run_main
from nanoverl_core.config import COMPONENTS
from nanoverl_core.config.domains import domain_of
from nanoverl_core.config.structure import user_fields
from nanoverl_core.plugins import load_registry

SELECT = {"actor": "actor.policy_loss", "algorithm": "algorithm.advantage_estimator", "tracking": "tracking.trackers",
          "data": "data.source"}
STARTS_ON_DEBUG = {"nanoverl", "nanoverl-grpo"}
"""Providers whose components run on the debug worker and rollout (the others need a model or a service)."""
NEEDS = {("environment", "copy_turns"): ["rollout.max_new_tokens=8"],
         ("advantage_estimator", "gae"): ["critic.enable=true"]}
"""Overrides a component needs next to its selection to be a valid config at its defaults."""


def components() -> list[tuple[str, str, str, type, bool]]:
    """(section, kind, name, settings class, runs on the debug backends) for every registered component
    with settings."""
    registry, out = load_registry(), []
    for section, kind in COMPONENTS.items():
        for name in registry.names(kind):
            cls = registry.settings_class(kind, name)
            if cls is not None:
                attrs.resolve_types(cls)  # as loading a config does: string annotations become types now, so
                # every draw sees the same field types (a Literal's choices, not a string's values)
                provider = registry.entry(kind, name).provider
                out.append((section, kind, name, cls, provider in STARTS_ON_DEBUG))
    return out


COMPONENTS_WITH_SETTINGS = components()


def _number_values(field: attrs.Attribute) -> list[str]:
    domain = domain_of(field)
    values = [0, 1, -1, 0.5, 1e30, "nan", "inf", "-inf"]
    if domain is not None:
        for bound in (domain.low, domain.high):
            if bound is not None:
                values += [bound, bound - 1, bound + 1, bound - 1e-3, bound + 1e-3]
        if domain.multiple:
            values += [domain.multiple * 3, domain.multiple * 3 + 1]
    is_int = field.type in (int, "int", int | None, "int | None")
    return [str(int(v)) if is_int and isinstance(v, float) and math.isfinite(v) and abs(v) < 1e18 else str(v)
            for v in values]


def field_values(field: attrs.Attribute) -> list[str]:
    """Override texts for one settings field: inside, at and beyond its declared domain, and wrong types."""
    kind = field.type
    if kind in (bool, "bool"):
        return ["true", "false", "1", "yes", "[]"]
    if typing.get_origin(kind) is typing.Literal:
        return [*map(str, typing.get_args(kind)), "not-a-choice", "1"]
    if kind in (int, float, "int", "float") or domain_of(field) is not None:
        return _number_values(field)
    if kind in (str, "str"):
        return ["", "x", "runs", "1", "[a]"]
    return ["[]", "1", "x"]


@st.composite
def drawn_settings(draw):
    section, kind, name, cls, starts = draw(st.sampled_from(COMPONENTS_WITH_SETTINGS))
    fields = list(user_fields(cls).values())
    chosen = draw(st.lists(st.sampled_from(fields), min_size=1, max_size=min(3, len(fields)), unique_by=lambda f: f.name))
    overrides = [f"{section}.{name}.{f.name}={draw(st.sampled_from(field_values(f)))}" for f in chosen]
    selector = f"{SELECT.get(section, f'{section}.name')}={f'[jsonl,{name}]' if section == 'tracking' else name}"
    return [selector, *NEEDS.get((kind, name), []), *overrides], starts


def one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr[-2000:]
    return errors[0]


@pytest.fixture(autouse=True)
def _in_the_repository(monkeypatch):
    from conftest import ROOT
    monkeypatch.chdir(ROOT)


@settings(settings.get_profile(PROFILE), max_examples=200 * SCALE)
@given(case=drawn_settings())
def test_settings_the_dry_run_accepts_start_a_run_and_the_others_are_one_line(tmp_path_factory, case):
    overrides, starts = case
    run_dir = tmp_path_factory.mktemp("settings") / "run"
    rc, _, stderr = run_main(["--config", REINFORCE, "--dry-run", f"trainer.output_dir={run_dir}", *overrides])
    assert rc in (0, 2), (overrides, rc, stderr[-2000:])
    if rc == 2:
        one_error_line(stderr)
        return
    assert not run_dir.exists(), "a dry-run wrote the run directory"
    if not starts:
        return
    rc, _, stderr = run_main(["--config", REINFORCE, f"trainer.output_dir={run_dir}", "trainer.progress=none",
                              "trainer.total_steps=1", "trainer.save_every=0", "data.val_files=[]",
                              "data.batch_size=4", "rollout.n=2", "tracking.trackers=[jsonl]", *overrides])
    if rc == 2:  # the run started and its first step failed (a loss that overflows, an environment's answer the
        one_error_line(stderr)  # debug tokenizer cannot encode): one line. A start that fails undoes its run
        assert (run_dir / "metrics.jsonl").exists(), ("refused before the first step, which the dry-run "
                                                      "should have", overrides, stderr[-2000:])
    else:
        assert rc == 0, (overrides, rc, stderr[-2000:])


def test_the_walk_sees_the_components_of_every_kind_with_settings():
    kinds = {kind for _, kind, _, _, _ in COMPONENTS_WITH_SETTINGS}
    assert {"worker", "rollout", "policy_loss", "tracker", "environment"} <= kinds, kinds
    assert any(starts for *_, starts in COMPONENTS_WITH_SETTINGS)
