"""The public surface plugins build on, as data: what tests/test_versioning.py pins.

    python tests/surface.py                  # print the surface of the installed nanoverl_core as JSON
    python tests/surface.py --update         # write tests/data/public_surface/<version>.json (after CHANGELOG.md)

One entry per name a plugin can rely on, "<where> <name>" -> its signature or type:
  * `export <name>`: each name of `nanoverl_core.__all__`;
  * `hook <name>`: each hook spec with its signature, and `register` (the callback every hook gets);
  * `protocol <Class>.<member>`: each protocol of `nanoverl_core.protocols`, its methods' signatures and
    its annotated attributes;
  * `object <Class>.<field>`: the fields of the objects the core hands to plugins or takes from them
    (PolicyLossInputs, SamplingParams, Workers, Turn, EnvStep) and RLBatch's public methods.
Changing any of these is a change of the plugin API (CONTRACTS, "Versioning").
"""

from __future__ import annotations

import inspect
import json
import sys
import typing
from pathlib import Path

import attrs

SNAPSHOTS = Path(__file__).parent / "data" / "public_surface"
"""<version>.json: the surface each version shipped (0.1.0.json: this script run over the 0.1.0 sources)."""


def _signature(fn) -> str:
    return str(inspect.signature(fn)).replace("'", "")


def _protocol_members(cls) -> dict[str, str]:
    out = {}
    for name, annotation in getattr(cls, "__annotations__", {}).items():
        out[name] = str(annotation)
    for name, value in vars(cls).items():
        if name.startswith("_") and name != "__call__":
            continue
        if callable(value):
            out[name] = _signature(value)
        elif isinstance(value, property):
            out[name] = "property"
    return out


def public_surface() -> dict[str, str]:
    import nanoverl_core
    from nanoverl_core import hookspecs, protocols
    from nanoverl_core.algos import PolicyLossInputs
    from nanoverl_core.batch import RLBatch
    from nanoverl_core.env import EnvStep, Turn
    from nanoverl_core.rollout import SamplingParams

    surface = {f"export {name}": "exported" for name in nanoverl_core.__all__}
    for name, fn in vars(hookspecs).items():
        if name.startswith("register_") and callable(fn):
            surface[f"hook {name}"] = _signature(fn)
    surface["hook register"] = _signature(hookspecs.Register.__call__)
    for name, cls in vars(protocols).items():
        if inspect.isclass(cls) and cls.__module__ == protocols.__name__ and typing.Protocol in cls.__mro__:
            for member, sig in _protocol_members(cls).items():
                surface[f"protocol {name}.{member}"] = sig
    workers = getattr(protocols, "Workers", None) or nanoverl_core.Workers
    for cls in (PolicyLossInputs, SamplingParams, workers, Turn, EnvStep):
        for field in attrs.fields(cls):
            surface[f"object {cls.__name__}.{field.name}"] = str(field.type)
    for name, value in vars(RLBatch).items():
        if not name.startswith("_") or name in ("__getitem__", "__setitem__", "__contains__", "__len__"):
            if callable(value) or isinstance(value, (staticmethod, classmethod)):
                surface[f"object RLBatch.{name}"] = _signature(getattr(RLBatch, name))
    return dict(sorted(surface.items()))


if __name__ == "__main__":
    import nanoverl_core

    data = {"version": nanoverl_core.__version__, "surface": public_surface()}
    if "--update" in sys.argv:
        (SNAPSHOTS / f"{data['version']}.json").write_text(json.dumps(data, indent=1) + "\n")
    else:
        print(json.dumps(data, indent=1))
