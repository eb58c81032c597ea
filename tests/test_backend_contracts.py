"""docs/plugins.md, "What an outside backend can rely on": each statement, tested as written."""

from __future__ import annotations

import inspect
import json
import math
import re

import pytest
import torch

from conftest import EXAMPLES, ROOT

REINFORCE = str(EXAMPLES / "debug_reinforce.toml")


def test_workers_is_the_protocols_class_and_takes_tokenizer_actor_reference_critic_teacher():
    import nanoverl_core
    from nanoverl_core.protocols import Workers

    assert nanoverl_core.Workers is Workers
    assert list(inspect.signature(Workers).parameters) == ["tokenizer", "actor", "reference", "critic", "teacher"]
    workers = Workers("tok", "actor")                    # a 0.3.0 factory's call: the new field defaults to None
    assert workers.reference is None and workers.critic is None and workers.teacher is None


def test_the_tokenizer_contract_lists_every_attribute_the_core_reads():
    from nanoverl_core.protocols import TOKENIZER_CONTRACT

    read = set()
    for path in (ROOT / "nanoverl_core").rglob("*.py"):
        text = path.read_text()
        read |= set(re.findall(r"tokenizer\.([a-z_]+)", text))
        read |= set(re.findall(r"getattr\(tokenizer, \"([a-z_]+)\"", text))
    assert read <= set(TOKENIZER_CONTRACT), read - set(TOKENIZER_CONTRACT)


def test_the_debug_tokenizer_meets_the_tokenizer_contract():
    from nanoverl_core.builtins.debug import CharTokenizer

    tok = CharTokenizer()
    ids = tok.encode("12=", add_special_tokens=False)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    assert tok.decode(ids, skip_special_tokens=True) == "12="
    assert isinstance(tok.pad_token_id, int) and isinstance(tok.eos_token_id, int)


def _debug_workers(*overrides: str):
    from nanoverl_core.config import load_config
    from nanoverl_core.plugins import load_registry

    registry = load_registry()
    config = load_config(REINFORCE, ["data.batch_size=4", "rollout.n=2", *overrides], registry=registry)
    return config, registry.get("worker", "debug")(config)


def _rollout_batch(config, workers, rows: int = 8):
    from nanoverl_core.batch import RLBatch
    from nanoverl_core.builtins.debug import DebugRollout
    from nanoverl_core.rollout import SamplingParams

    prompts = torch.tensor([workers.tokenizer.encode(f"{i}{i}=") for i in range(rows)])
    batch = RLBatch({"prompts": prompts, "prompt_mask": torch.ones_like(prompts)})
    torch.manual_seed(0)
    return batch.update(DebugRollout(config, workers).generate(batch, SamplingParams(temperature=1.0, max_new_tokens=4)))


def test_check_actor_recipe_as_written_passes_for_the_debug_actor():
    from nanoverl_core.algos import vanilla
    from nanoverl_core.testing import check_actor

    config, workers = _debug_workers()
    batch = _rollout_batch(config, workers)
    metrics = check_actor(workers.actor, batch)
    assert metrics and all(isinstance(v, float) for v in metrics.values())
    # the recipe, by hand: old = ref = the log-probs, advantages +1 on response tokens, loss_mask = response_mask
    train = batch.index(slice(None))
    lp = workers.actor.compute_log_probs(batch)
    train["old_log_probs"], train["ref_log_probs"] = lp.clone(), lp.clone()
    train["advantages"] = batch["response_mask"].float()
    train["loss_mask"] = batch["response_mask"].clone()
    workers.actor.update(train, vanilla, on_policy=False)
    after = workers.actor.compute_log_probs(batch)
    mask = batch["response_mask"]
    assert float(((after - lp) * mask).sum()) > 0


def test_the_normalisers_make_the_loss_independent_of_the_micro_batch_size():
    from nanoverl_core.algos import PolicyLossInputs

    torch.manual_seed(0)
    loss_mat, mask = torch.randn(8, 5), (torch.rand(8, 5) > 0.3).float()
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        whole = PolicyLossInputs(loss_mat, loss_mat, loss_mat, mask, loss_agg_mode=mode, num_tokens=float(mask.sum()),
                                 num_seqs=float((mask.sum(1) > 0).sum()), loss_scale_factor=5.0)
        parts = [PolicyLossInputs(loss_mat[i:i + 2], loss_mat[i:i + 2], loss_mat[i:i + 2], mask[i:i + 2],
                                  loss_agg_mode=mode, num_tokens=whole.num_tokens, num_seqs=whole.num_seqs,
                                  loss_scale_factor=5.0) for i in range(0, 8, 2)]
        torch.testing.assert_close(sum(p.aggregate(p.log_prob) for p in parts), whole.aggregate(whole.log_prob))


def test_update_takes_no_keep_log_probs_and_a_nonfinite_loss_raises_without_stepping():
    from nanoverl_core.algos import vanilla
    from nanoverl_core.errors import NonFiniteError
    from nanoverl_core.protocols import Actor

    assert list(inspect.signature(Actor.update).parameters) == ["self", "batch", "policy_loss", "on_policy"]
    config, workers = _debug_workers()
    batch = _rollout_batch(config, workers)
    lp = workers.actor.compute_log_probs(batch)
    batch["old_log_probs"], batch["loss_mask"] = lp, batch["response_mask"].clone()
    batch["advantages"] = torch.full_like(lp, float("nan"))
    before = {k: v.clone() for k, v in workers.actor.full_tensors()}
    with pytest.raises(NonFiniteError):
        workers.actor.update(batch, vanilla, on_policy=False)
    assert all(torch.equal(before[k], v) for k, v in workers.actor.full_tensors()), "a non-finite update stepped"


def test_an_on_policy_update_returns_its_log_probs_and_the_0_2_side_channel_is_one_line():
    """on_policy_update returns pi_old with the metrics; 0.2.0's update(..., keep_log_probs=True), which kept
    them in `update_log_probs` (deprecated in 0.3.0), is one line naming on_policy_update, before any step."""
    from nanoverl_core.algos import vanilla
    from nanoverl_core.errors import PluginError

    config, workers = _debug_workers()
    batch = _rollout_batch(config, workers)
    batch["loss_mask"], batch["advantages"] = batch["response_mask"].clone(), batch["response_mask"].clone()
    before = workers.actor.compute_log_probs(batch)
    state = {k: v.clone() for k, v in workers.actor.module.state_dict().items()}
    for keep in (True, False):
        with pytest.raises(PluginError) as raised:
            workers.actor.update(batch, vanilla, on_policy=True, keep_log_probs=keep)
        line = str(raised.value)
        assert line.startswith("Actor.update(..., keep_log_probs=...) was removed in nanoverl 0.4.0: call "
                               "on_policy_update(batch, policy_loss)") and "\n" not in line, line
    assert all(torch.equal(state[k], v) for k, v in workers.actor.module.state_dict().items()), "it stepped"
    assert not hasattr(workers.actor, "update_log_probs")
    with pytest.raises(TypeError, match="keep_log_prob"):
        workers.actor.update(batch, vanilla, on_policy=True, keep_log_prob=True)
    metrics, kept = workers.actor.on_policy_update(batch, vanilla)
    torch.testing.assert_close(kept, before, rtol=1e-5, atol=1e-6)
    assert set(metrics) >= {"actor/pg_loss", "actor/grad_norm"}


def test_a_schedule_built_before_total_steps_is_known_reads_it_when_it_is_final():
    from nanoverl_core.config import load_config
    from nanoverl_core.workers.ppo import build_scheduler

    config = load_config(REINFORCE, ["trainer.total_epochs=1", "trainer.total_steps=null", "actor.lr=1.0",
                                     "actor.lr_schedule=linear", "actor.min_lr_ratio=0.1"])
    assert config.trainer.total_steps is None                        # as make_workers sees it
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scheduler = build_scheduler(optimizer, config.actor, lambda: config.trainer.total_steps)
    config.trainer.total_steps = 4                                   # set once the data is loaded
    lrs = []
    for _ in range(4):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.1 + 0.9 * 0.25)


def test_the_public_errors_and_the_batch_operations_a_plugin_may_use():
    from nanoverl_core import errors
    from nanoverl_core.batch import RLBatch

    for name in ("UserError", "ConfigError", "PluginError", "DataError", "RewardError", "EpisodeError",
                 "RolloutError", "NonFiniteError", "CheckpointError", "CheckpointMismatch"):
        assert isinstance(getattr(errors, name), type)
    assert issubclass(errors.CheckpointError, errors.UserError)
    batch = RLBatch({"x": torch.arange(4)}, {"row": list("abcd")})
    assert set(batch.keys()) == {"x", "row"} and len(batch) == 4
    picked = batch.index([0, 2])
    assert picked["row"] == ["a", "c"] and picked["x"].tolist() == [0, 2]
    assert batch.index(torch.tensor([True, False, True, False]))["row"] == ["a", "c"]
    both = RLBatch.concat([picked, batch.index(slice(1, 2))])
    assert both["x"].tolist() == [0, 2, 1]
    batch.update(RLBatch({"y": torch.zeros(4)}))
    assert "y" in batch.keys()


def test_the_docs_state_each_contract():
    text = (ROOT / "docs" / "plugins.md").read_text()
    section = text.split("## What an outside backend can rely on")[1].split("\n## ")[0]
    for needle in ("Workers(tokenizer, actor, reference=None, critic=None)", "TOKENIZER_CONTRACT", "check_actor",
                   "num_tokens", "on_policy_update", "NonFiniteError", "total_steps", "CheckpointError", "RLBatch"):
        assert needle in section, needle


# ---- an outside backend, written from docs/plugins.md alone: its own model, tokenizer and Actor -------------
class CharTokens:
    """The tokenizer contract (TOKENIZER_CONTRACT): printable characters, 0 pad, 1 eos."""

    pad_token_id, eos_token_id, chat_template = 0, 1, None
    chars = "0123456789:=+-*abcdefghijklmnopqrstuvwxyz "

    def encode(self, text, add_special_tokens=True):
        return [2 + self.chars.index(c) for c in text if c in self.chars]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.chars[i - 2] for i in ids if i >= 2)


class PrefixMeanLM(torch.nn.Module):
    """No transformers: each position's logits from its token and the mean of the tokens before it."""

    def __init__(self, vocab: int, width: int = 32):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(vocab, width), torch.nn.Linear(2 * width, vocab)

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        x = self.embed(input_ids) * (attention_mask if attention_mask is not None else 1)[..., None]
        seen = x.cumsum(1) / torch.arange(1, x.shape[1] + 1)[None, :, None]
        return type("Out", (), {"logits": self.head(torch.cat([x, seen], -1))})()


class OwnActor:
    """The Actor protocol: module, device, compute_log_probs, update, full_tensors, save, load."""

    def __init__(self, config, vocab: int):
        self.module, self.device, self.config = PrefixMeanLM(vocab), torch.device("cpu"), config
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=config.actor.lr)

    def _log_probs(self, batch):                               # (B, R) at the rollout temperature, 0 on padding
        ids = torch.cat([batch["prompts"], batch["responses"]], 1)
        mask = torch.cat([batch["prompt_mask"], batch["response_mask"].long()], 1)
        width = batch["responses"].shape[1]
        logits = self.module(input_ids=ids, attention_mask=mask).logits[:, -width - 1:-1]
        logits = logits / max(self.config.rollout.temperature, 1e-6)
        chosen = logits.log_softmax(-1).gather(-1, batch["responses"][..., None]).squeeze(-1)
        return chosen * batch["response_mask"]

    def compute_log_probs(self, batch):
        with torch.no_grad():
            return self._log_probs(batch)

    def update(self, batch, policy_loss, *, on_policy=False):
        from nanoverl_core.algos import PolicyLossInputs, compute_actor_loss
        from nanoverl_core.errors import NonFiniteError

        log_prob, mask = self._log_probs(batch), batch["loss_mask"]
        old = log_prob.detach() if on_policy else batch["old_log_probs"]
        inputs = PolicyLossInputs(log_prob=log_prob, old_log_prob=old, advantages=batch["advantages"], loss_mask=mask,
                                  loss_agg_mode=self.config.actor.loss_agg_mode, num_tokens=float(mask.sum()),
                                  num_seqs=float((mask.sum(-1) > 0).sum()), on_policy=on_policy)
        loss, metrics = compute_actor_loss(policy_loss, inputs, self.config.actor)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), float("inf"))
        if not (torch.isfinite(loss) and torch.isfinite(norm)):
            self.optimizer.zero_grad()
            raise NonFiniteError(f"non-finite loss or gradient ({float(loss)}, {float(norm)})")
        self.optimizer.step()
        self.optimizer.zero_grad()
        return {key: float(value) for key, value in metrics.items()}

    def full_tensors(self):
        yield from self.module.state_dict().items()

    def save(self, path):
        torch.save({"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}, path / "own.pt")

    def load(self, path):
        state = torch.load(path / "own.pt")
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def make_own_workers(config):
    from nanoverl_core import Workers

    tokenizer = CharTokens()
    return Workers(tokenizer, OwnActor(config, vocab=2 + len(tokenizer.chars)))


def test_an_outside_actor_from_the_docs_passes_check_actor_and_trains_20_steps(tmp_path):
    from nanoverl_core import load_config, load_registry
    from nanoverl_core.testing import check_actor, check_rollout, prompt_batch, without_machine_metrics
    from nanoverl_core.trainer.trainer import Trainer

    registry = load_registry()
    registry.add("worker", "own", make_own_workers, "an outside backend")
    config = load_config(REINFORCE, [f"trainer.output_dir={tmp_path}", "worker.name=own", "rollout.name=debug",
                                     "trainer.total_steps=20", "trainer.val_every=10", "trainer.save_every=10",
                                     "trainer.progress=none", "tracking.trackers=[jsonl]"], registry=registry)
    workers = make_own_workers(config)
    torch.manual_seed(0)
    batch = prompt_batch(workers.tokenizer, ["12:", "345:"], n=2)
    batch.update(check_rollout(registry.get("rollout", "debug")(config, workers), batch, max_new_tokens=4))
    check_actor(workers.actor, batch)                      # the contract check a backend author runs
    Trainer(config, registry).fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 21)) and "val/reward/mean" in rows[-1]
    assert all(math.isfinite(v) for r in rows for v in without_machine_metrics(r).values())
    assert (tmp_path / "checkpoints").is_dir()
