"""The written contracts hold as written: a backend built only from nanoverl_core.protocols passes
nanoverl_core.testing's checks (update included), the checks catch what breaks a contract, and every
optional attribute the framework reads off a plugin's object is documented in protocols.py."""

from __future__ import annotations

import ast
import inspect
import re
import types
from pathlib import Path

import pytest
import torch

from conftest import EXAMPLES, ROOT
from nanoverl_core import (RLBatch, SamplingParams, hookimpl, load_config, load_registry, plugins, protocols,
                           responses_to_batch)
from nanoverl_core.algos import PolicyLossInputs, compute_actor_loss, loss_totals
from nanoverl_core.builtins.debug import CharTokenizer, TinyCausalLM, make_rollout, make_workers
from nanoverl_core.hookspecs import Register
from nanoverl_core.testing import check_actor, check_rollout, prompt_batch

PPO = EXAMPLES / "debug_ppo.toml"


# ---- an actor written only from protocols.Actor ---------------------------------------------------
class MinimalActor:
    """A third-party policy written from `nanoverl_core.protocols.Actor` alone: no TorchActor, the whole
    batch in one forward, one optimizer step per update."""

    def __init__(self, module: torch.nn.Module, config, temperature: float = 1.0):
        self.module, self.device, self.config, self.temperature = module, torch.device("cpu"), config, temperature
        self.optimizer = torch.optim.Adam(module.parameters(), lr=config.lr)

    def _log_probs(self, batch: RLBatch) -> torch.Tensor:
        """(B, R) log pi(response token) at the rollout temperature, 0 on padding, with grad."""
        mask = torch.cat([batch["prompt_mask"], batch["response_mask"].long()], 1)       # (B, P + R)
        logits = self.module(input_ids=torch.cat([batch["prompts"], batch["responses"]], 1), attention_mask=mask,
                             position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        width = batch["responses"].shape[1]
        logits = logits[:, -width - 1:-1].float() / self.temperature                    # (B, R, V)
        chosen = logits.log_softmax(-1).gather(-1, batch["responses"][..., None]).squeeze(-1)
        return chosen * batch["response_mask"]

    @torch.no_grad()
    def compute_log_probs(self, batch: RLBatch) -> torch.Tensor:
        return self._log_probs(batch)

    def update(self, batch: RLBatch, policy_loss, *, on_policy: bool = False) -> dict[str, float]:
        mask = batch["response_mask"]
        log_prob = self._log_probs(batch)
        old = log_prob.detach() if on_policy else batch["old_log_probs"]
        inputs = PolicyLossInputs(log_prob, old, batch["advantages"], mask, loss_agg_mode=self.config.loss_agg_mode,
                                  on_policy=on_policy, **loss_totals(mask))
        loss, metrics = compute_actor_loss(policy_loss, inputs, self.config)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {key: float(value) for key, value in metrics.items()}

    def full_tensors(self):
        for name, tensor in self.module.state_dict().items():
            yield name, tensor.detach()

    def save(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        torch.save({"module": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}, path / "actor.pt")

    def load(self, path: Path) -> None:
        state = torch.load(path / "actor.pt", weights_only=True)
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])


def sampled_batch(texts=("12=", "345=", "6="), n: int = 2) -> RLBatch:
    """Prompts with responses sampled by the debug rollout (some end in EOS, some are cut at 4 tokens)."""
    cfg = load_config(PPO, registry=load_registry())
    workers = make_workers(cfg)
    batch = prompt_batch(workers.tokenizer, list(texts), n=n)
    torch.manual_seed(3)
    batch.update(make_rollout(cfg, workers).generate(batch, SamplingParams(max_new_tokens=4)))
    return batch


def minimal_actor(cls=MinimalActor) -> MinimalActor:
    torch.manual_seed(0)
    config = load_config(PPO, ["actor.lr=1e-2"], registry=load_registry()).actor
    return cls(TinyCausalLM(CharTokenizer().vocab_size, hidden=32, layers=1), config)


def test_an_actor_written_only_from_the_protocol_passes_check_actor_with_its_update():
    actor, batch = minimal_actor(), sampled_batch()
    assert batch["response_mask"].sum() < batch["response_mask"].numel()          # padding is exercised
    before = actor.compute_log_probs(batch)
    metrics = check_actor(actor, batch)
    assert {"actor/pg_loss", "actor/loss", "actor/pg_clipfrac", "actor/ppo_kl"} <= metrics.keys()
    assert metrics["actor/pg_loss"] == pytest.approx(-1.0)     # ratio 1, advantages 1: -mean(ratio * A)
    assert "advantages" not in batch and not torch.equal(actor.compute_log_probs(batch), before)


class NoStep(MinimalActor):
    def update(self, batch, policy_loss, *, on_policy=False):
        return {"actor/pg_loss": 0.0}


class Ascends(MinimalActor):
    def update(self, batch, policy_loss, *, on_policy=False):
        def ascend(inputs, config):
            loss, metrics = policy_loss(inputs, config)
            return -loss, metrics
        return super().update(batch, ascend, on_policy=on_policy)


class TensorMetrics(MinimalActor):
    def update(self, batch, policy_loss, *, on_policy=False):
        return {key: torch.tensor(value) for key, value in super().update(batch, policy_loss).items()}


@pytest.mark.parametrize("cls, rule", [(NoStep, "update must change the weights"),
                                       (Ascends, "must raise the responses' mean log-prob"),
                                       (TensorMetrics, "metrics must be finite floats")])
def test_check_actor_names_the_rule_a_broken_update_breaks(cls, rule):
    with pytest.raises(AssertionError, match=re.escape(rule)):
        check_actor(minimal_actor(cls), sampled_batch())


def test_a_frozen_reference_is_checked_without_an_update():
    cfg = load_config(PPO, ["reference.enable=true"], registry=load_registry())
    workers = make_workers(cfg)
    batch = sampled_batch()
    weights = {name: tensor.clone() for name, tensor in workers.reference.full_tensors()}
    assert check_actor(workers.reference, batch, update=False) is None
    assert all(torch.equal(weights[name], tensor) for name, tensor in workers.reference.full_tensors())


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
    "_compiled_call_impl",  # torch: set by nn.Module.compile (model.compile compiles a shared module once)
    "attention_dropout", "bos_token_id", "dtype", "save_pretrained", "get_text_config", "head_dim",
    "max_position_embeddings", "num_key_value_heads", "chat_template", "batch_decode",
    "_attn_implementation",  # transformers: the attention a config selects (workers/packing.py's layouts)
    "layer_types",  # transformers: each layer's attention kind (full / sliding), which packing's layout reads
    "layers",  # transformers: a Cache's per-layer keys and values (the hf rollout keeps them across turns)
    # vLLM, MLflow, Reasoning Gym (a task config's validate()) and Python objects
    "ensure_alive", "resources", "processes", "error_code", "_metric_objs", "validate", "strerror", "__module__", "__qualname__",
    "_validators",  # attrs' and_ validator (a list of validators on a field), searched for a declared domain
    "Solution", "__all__",  # nanoverl-code: a program's LeetCode-style class; a star-imported module's names
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


# ---- the protocols name the batch columns batch.py describes --------------------------------------------
BATCH_NAMES = ("batch", "mb", "rows", "out", "one", "sub", "prompts", "generated", "scored", "train", "kept", "first")
"""What the core calls an RLBatch where it reads or writes a column by name."""


def columns_in_code() -> set[str]:
    """Every column the core reads or writes by a literal name: batch["name"], "name" in batch, and the keys of
    an RLBatch({...}) literal."""
    found = set()
    for path in (ROOT / "nanoverl_core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) in BATCH_NAMES:
                found |= {node.slice.value} if isinstance(node.slice, ast.Constant) else set()
            elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)) and \
                    getattr(node.comparators[0], "id", None) in BATCH_NAMES and isinstance(node.left, ast.Constant):
                found.add(node.left.value)
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "RLBatch" and node.args and \
                    isinstance(node.args[0], ast.Dict):
                found |= {k.value for k in node.args[0].keys if isinstance(k, ast.Constant)}
    return {name for name in found if isinstance(name, str) and re.fullmatch(r"[a-z][a-z0-9_]*", name)}


def described_columns() -> set[str]:
    """The columns batch.py's docstring describes (its table and its non-tensor list) and the episodes' columns
    env/episode.py's docstring lists."""
    from nanoverl_core import batch
    from nanoverl_core.env import episode

    table = set(re.findall(r"^    ([a-z_]+)(?:, ([a-z_]+))?\s*\(", batch.__doc__, re.M))
    names = {name for pair in table for name in pair if name}
    names |= set(re.findall(r"`([a-z_]+)`", batch.__doc__.split("Non-tensor columns", 1)[1].split("\n\n")[0]))
    return names | set(re.findall(r"^    ([a-z_]+)\b", episode.__doc__, re.M))


def protocol_docstrings() -> dict[str, str]:
    docs = {}
    for name, cls in vars(protocols).items():
        if isinstance(cls, type) and cls.__module__ == protocols.__name__:
            docs[name] = cls.__doc__ or ""
            docs |= {f"{name}.{m}": f.__doc__ or "" for m, f in vars(cls).items() if callable(f) and f.__doc__}
    return docs


def test_every_column_a_protocol_names_is_one_batch_py_describes():
    """A protocol that names a column names one the batch's own description has: a column renamed or added in
    the code and the protocols, but not in batch.py (or the other way round), fails here."""
    columns, described = columns_in_code(), described_columns()
    assert {"responses", "loss_mask", "rollout_log_probs", "reward_baselines", "sum_pi_squared"} <= columns
    named = {(where, name) for where, doc in protocol_docstrings().items()
             for name in re.findall(r"``?([a-z_]+)``?", doc) if name in columns}
    missing = sorted((where, name) for where, name in named if name not in described)
    assert not missing, f"columns the protocols name but nanoverl_core/batch.py does not describe: {missing}"
    assert {name for _, name in named} >= {"loss_mask", "advantages", "model_mask", "truncated", "reward_baselines"}


def test_what_the_rollout_protocol_says_a_rollout_returns_is_what_the_trainer_accepts():
    """Rollout.generate's docstring lists the columns a rollout returns, then the ones it never returns: a batch
    with the first passes `check_rollout_columns`, and adding any of the second is refused."""
    from nanoverl_core.errors import PluginError
    from nanoverl_core.rollout import check_rollout_columns, responses_to_batch

    doc = " ".join(protocols.Rollout.generate.__doc__.split())
    returns = doc.split("rows in the same order:", 1)[1].split("; never ", 1)[0]
    never = doc.split("; never ", 1)[1].split(".", 1)[0].split(";", 1)[0]
    columns = columns_in_code()
    returned = [name for name in re.findall(r"`(\w+)`", returns) if name in columns]
    refused = [name for name in re.findall(r"`(\w+)`", never) if name in columns]
    assert {"responses", "response_mask", "truncated", "rollout_log_probs", "model_mask"} <= set(returned)
    assert refused == ["loss_mask"], refused
    out = responses_to_batch([[3, 1], [3, 3]], eos_token_id=1, pad_token_id=0, max_new_tokens=4)
    for name in returned:
        if name not in out:
            out[name] = torch.zeros(out["response_mask"].shape)
    assert check_rollout_columns(out, "doc") is out
    for name in refused:
        bad = out.index(slice(None))
        bad[name] = out["response_mask"]
        with pytest.raises(PluginError):
            check_rollout_columns(bad, "doc")
