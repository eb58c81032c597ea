"""The written contracts hold as written: check_rollout checks the rollout's truncated output,
hookspecs.Register is the callback plugins.py builds, and every optional attribute the framework reads
off a plugin's object is documented in protocols.py."""

from __future__ import annotations

import ast
import inspect
import re
import types

import pytest
import torch

from conftest import ROOT
from nanoverl_core import RLBatch, hookimpl, plugins, protocols, responses_to_batch
from nanoverl_core.builtins.debug import CharTokenizer
from nanoverl_core.hookspecs import Register
from nanoverl_core.testing import check_rollout, prompt_batch


# ---- the rollout's truncated output -------------------------------------------------------------------
@pytest.mark.parametrize("as_tensor", [False, True])
def test_responses_to_batch_marks_the_rows_without_a_stop_token_as_truncated(as_tensor):
    rows = [[5, 1, 7, 7, 7], [5, 6, 7, 8, 9], [5, 6, 7, 2, 9], [1, 0, 0, 0, 0]]   # stop ids 1 and 2
    out = responses_to_batch(torch.tensor(rows) if as_tensor else rows, eos_token_id=[1, 2], pad_token_id=0,
                             max_new_tokens=4)
    assert out["truncated"].dtype == torch.bool and out["truncated"].tolist() == [False, True, False, False]
    assert out["response_mask"].sum(-1).tolist() == [2, 4, 4, 1]


class FixedRollout:
    """Deterministic responses that depend only on the prompt: its last token, then EOS (1); `truncated`
    claims the rows of odd-length prompts were cut (they were not: they hold EOS)."""

    returns_log_probs = False

    def generate(self, batch, params):
        lengths = batch["prompt_mask"].sum(-1)
        responses = torch.stack([batch["prompts"][:, -1], torch.ones(len(batch), dtype=torch.long)], 1)
        return RLBatch({"responses": responses, "response_mask": torch.ones(responses.shape),
                        "truncated": lengths % 2 == 1})

    def sync_weights(self, actor):
        pass

    def close(self):
        pass


class NoTruncated(FixedRollout):
    def generate(self, batch, params):
        out = super().generate(batch, params)
        out.pop("truncated")
        return out


@pytest.mark.parametrize("rollout, rule", [(NoTruncated(), "generate must return truncated, (B,) bool"),
                                           (FixedRollout(), "although truncated, a token that ends a row")])
def test_check_rollout_requires_a_truncated_flag_that_agrees_with_the_stop_tokens(rollout, rule):
    batch = prompt_batch(CharTokenizer(), ["12=", "3456", "7="], n=2)       # prompt lengths 3, 4, 2
    with pytest.raises(AssertionError, match=re.escape(rule)):
        check_rollout(rollout, batch)


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
