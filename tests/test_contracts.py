"""The written contracts hold as written: hookspecs.Register is the callback plugins.py builds, and every
optional attribute the framework reads off a plugin's object is documented in protocols.py."""

from __future__ import annotations

import ast
import inspect
import re
import types

from conftest import ROOT
from nanoverl_core import hookimpl, plugins, protocols
from nanoverl_core.hookspecs import Register


# ---- hookspecs.Register is the callback plugins.py builds ---------------------------------------------
CAPTURED: list = []


@hookimpl
def register_rollouts(register):
    CAPTURED.append(register)


def test_the_register_callback_has_the_signature_of_hookspecs_register(monkeypatch):
    real = plugins.make_plugin_manager

    def with_capture():
        pm, infos = real()
        pm.register(types.SimpleNamespace(register_rollouts=register_rollouts), name="capture")
        return pm, [*infos, plugins.PluginInfo("capture", "0", __name__)]

    monkeypatch.setattr(plugins, "make_plugin_manager", with_capture)
    CAPTURED.clear()
    plugins.load_registry()
    public = [p for p in inspect.signature(CAPTURED[0]).parameters.values() if not p.name.startswith("_")]
    declared = list(inspect.signature(Register.__call__).parameters.values())[1:]     # without self
    assert [(p.name, p.kind, p.default) for p in public] == [(p.name, p.kind, p.default) for p in declared]


# ---- every optional attribute the framework reads is documented ---------------------------------------
NOT_CONTRACTS = {
    # torch (DTensor), transformers / peft models and configs, and Hugging Face tokenizers: the module and
    # tokenizer conventions nanoverl_core.workers documents, read where those libraries may lack them
    "full_tensor", "to_local", "shape", "generation_config", "eos_token_id", "get_output_embeddings",
    "get_base_model", "is_activation_checkpointing", "generate", "config", "_no_split_modules",
    "attention_dropout", "bos_token_id", "dtype", "save_pretrained", "get_text_config", "head_dim",
    "max_position_embeddings", "num_key_value_heads", "chat_template", "batch_decode",
    # vLLM, MLflow and Python objects
    "ensure_alive", "error_code", "_metric_objs", "strerror", "__module__", "__qualname__",
    # nanoverl's own objects read defensively (Trainer.rollout before it is built, a partial Config)
    "rollout", "trainer", "total_steps",
}
"""Attributes read with getattr / hasattr that no plugin is asked to provide."""


def attributes_read() -> dict[str, list[str]]:
    """Every literal getattr(x, "name", ...) / hasattr(x, "name") in the core and the plugins' sources:
    name -> where."""
    found: dict[str, list[str]] = {}
    for path in sorted([*(ROOT / "nanoverl_core").rglob("*.py"), *ROOT.glob("plugins/*/src/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            reads = isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr")
            name = node.args[1] if reads and len(node.args) >= 2 else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                found.setdefault(name.value, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def documented_attributes() -> tuple[set[str], set[str]]:
    """(the "Optional attributes" of every protocol's docstring, every protocol's declared members)."""
    optional, members = set(), set()
    for cls in vars(protocols).values():
        if isinstance(cls, type) and getattr(cls, "_is_protocol", False) and cls.__module__ == protocols.__name__:
            section = (cls.__doc__ or "").partition("Optional attributes:")[2]
            optional |= set(re.findall(r"^\s*\* ``(\w+)``", section, re.M))
            members |= {name for name in vars(cls) if not name.startswith("_")}
            members |= set(vars(cls).get("__annotations__", {}))
    return optional, members


def test_every_optional_attribute_the_code_reads_is_documented_in_protocols():
    read = attributes_read()
    optional, members = documented_attributes()
    assert {"check_config", "export_checkpoint", "supports_lora", "requires_critic", "batched", "lora"} <= optional
    undocumented = {name: where for name, where in read.items() if name not in optional | members | NOT_CONTRACTS}
    assert not undocumented, "attributes read off plugin objects but documented nowhere: add each to its " \
        f"protocol's 'Optional attributes' in nanoverl_core/protocols.py (or to NOT_CONTRACTS): {undocumented}"
    assert not optional - read.keys(), f"documented but never read: {sorted(optional - read.keys())}"
    assert not NOT_CONTRACTS - read.keys(), f"NOT_CONTRACTS lists what is no longer read: {NOT_CONTRACTS - read.keys()}"
    assert not optional & NOT_CONTRACTS
