"""The `debug` worker and rollout: a tiny causal transformer in pure torch over a character vocabulary.

Real sampling and real gradients with no transformers dependency, so the core trains on its own.
The model follows the Hugging Face calling convention (input_ids, attention_mask, position_ids ->
.logits), which is all `TorchActor` / `TorchCritic` need.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from ..algos import logprobs_from_logits
from ..batch import RLBatch
from ..config import Config, settings_or_defaults
from ..errors import ConfigError, DataError
from ..rollout import SamplingParams, responses_to_batch
from ..workers import NonFiniteError, TorchActor, TorchCritic, Workers, resolve_device
from .debug_settings import ALPHABET, DebugModelSettings, DebugRolloutSettings


class CharTokenizer:
    """Characters of a small alphabet; id 0 is padding, id 1 is end-of-sequence."""

    alphabet = ALPHABET
    pad_token_id, eos_token_id = 0, 1
    chat_template = None

    def __init__(self) -> None:
        self.vocab = {ch: i + 2 for i, ch in enumerate(self.alphabet)}
        self.vocab_size = len(self.vocab) + 2

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        unknown = sorted(set(text) - set(self.vocab))
        if unknown:
            raise DataError(f"the debug tokenizer has no token for {unknown!r} in {text!r}; "
                            f"debug prompts may only use {self.alphabet!r}")
        return [self.vocab[ch] for ch in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        chars = {i: ch for ch, i in self.vocab.items()}
        return "".join(chars.get(int(i), "" if skip_special_tokens else "<s>") for i in ids)


class _Block(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, C // self.heads).transpose(1, 3).unbind(2)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # (B, heads, T, C/heads)
        x = x + self.proj(att.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class TinyCausalLM(nn.Module):
    """A few pre-norm transformer blocks; `out_dim=1` makes it a value model."""

    def __init__(self, vocab_size: int, hidden: int = 64, layers: int = 2, heads: int = 4,
                 max_positions: int = 512, out_dim: int | None = None):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab_size, hidden), nn.Embedding(max_positions, hidden)
        self.blocks = nn.ModuleList(_Block(hidden, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(hidden), nn.Linear(hidden, out_dim or vocab_size)

    def forward(self, input_ids, attention_mask=None, position_ids=None, **_):
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if position_ids is None:
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        x = self.embed(input_ids) + self.pos(position_ids)  # (B, T, C)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        # a token sees earlier real tokens, and always itself (so left padding never yields an empty row)
        allowed = (causal & attention_mask[:, None, :].bool()) | torch.eye(T, dtype=torch.bool, device=x.device)
        for block in self.blocks:
            x = block(x, allowed[:, None])
        return SimpleNamespace(logits=self.head(self.norm(x)))


def sampling_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(B, V) logits of the distribution a sampled token is drawn from: divided by the temperature,
    then everything outside the top-k and the top-p nucleus set to -inf."""
    logits = logits / params.temperature
    if params.top_k:
        kth = logits.topk(min(params.top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1:
        sorted_logits, order = logits.sort(descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) > params.top_p  # keep the smallest prefix reaching top_p
        logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return logits


def sample_from_logits(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, V) logits -> (B,) token ids with temperature, top-k and top-p (greedy when temperature is 0),
    and (B,) each token's log-prob under the distribution it was drawn from (the raw softmax when greedy)."""
    if params.greedy:
        token = logits.argmax(-1)
    else:
        logits = sampling_logits(logits, params)
        token = torch.multinomial(logits.softmax(-1), 1).squeeze(-1)
    return token, logprobs_from_logits(logits[:, None], token[:, None]).squeeze(-1)  # the trainer's own function


class DebugRollout:
    """Token-by-token sampling with the actor's own module (shared in-process, so sync is free).
    With [rollout.debug] log_probs = true it also returns rollout_log_probs, as an engine would."""

    def __init__(self, config: Config, workers: Workers):
        self.tokenizer = workers.tokenizer
        self.module = workers.actor.module
        self.device = workers.actor.device
        settings = config.rollout.settings  # a subclass registered under another name brings its own settings
        self.returns_log_probs = settings_or_defaults(settings, DebugRolloutSettings).log_probs

    @torch.no_grad()
    def generate(self, batch: RLBatch, params: SamplingParams) -> RLBatch:
        ids, mask = batch["prompts"].to(self.device), batch["prompt_mask"].to(self.device)
        done = torch.zeros(len(batch), dtype=torch.bool, device=self.device)
        out, log_probs = [], []
        for _ in range(params.max_new_tokens):
            logits = self.module(input_ids=ids, attention_mask=mask).logits[:, -1].float()
            if not torch.isfinite(logits).all():
                raise NonFiniteError("the policy's logits are NaN/inf during rollout: its weights diverged (often "
                                     "a learning rate that is too high); lower actor.lr and resume from an earlier "
                                     "checkpoint (trainer.resume=PATH)")
            token, log_prob = sample_from_logits(logits, params)
            token = token.masked_fill(done, self.tokenizer.pad_token_id)
            out.append(token)
            log_probs.append(log_prob)
            ids = torch.cat([ids, token[:, None]], 1)
            mask = torch.cat([mask, (~done).long()[:, None]], 1)
            done |= token == self.tokenizer.eos_token_id
            if done.all():
                break
        tokens = torch.stack(out, 1).tolist()
        return responses_to_batch(tokens, eos_token_id=self.tokenizer.eos_token_id,
                                  pad_token_id=self.tokenizer.pad_token_id, max_new_tokens=params.max_new_tokens,
                                  log_probs=torch.stack(log_probs, 1).tolist() if self.returns_log_probs else None)

    def sync_weights(self, actor) -> None:
        """Nothing to copy: generation runs on the actor's own module."""
        assert self.module is actor.module

    def close(self) -> None:
        """Nothing to free: the module is the actor's."""


def make_workers(config: Config) -> Workers:
    tokenizer = CharTokenizer()
    device = resolve_device(config.trainer.device)
    m = settings_or_defaults(config.worker.settings, DebugModelSettings)
    vocab = m.vocab_size or tokenizer.vocab_size
    torch.manual_seed(config.trainer.seed)
    policy = TinyCausalLM(vocab, m.hidden_size, m.num_layers).to(device)
    reference = copy.deepcopy(policy) if config.reference.enable else None
    critic = TinyCausalLM(vocab, m.hidden_size, m.num_layers, out_dim=1).to(device) if config.critic.enable else None
    teacher = copy.deepcopy(policy) if config.teacher.enable else None   # the trainer loads the checkpoint into it
    return Workers(tokenizer=tokenizer, actor=TorchActor(policy, config, device=device),
                   reference=TorchActor(reference, config, trainable=False, device=device) if reference else None,
                   critic=TorchCritic(critic, config, device=device) if critic else None,
                   teacher=TorchActor(teacher, config, trainable=False, device=device) if teacher else None)


def check_config(config: Config) -> None:
    """Before any write: a teacher is a checkpoint of a debug run (this worker loads no model files)."""
    if config.teacher.enable and not config.teacher.from_checkpoint:
        raise ConfigError(f"teacher.path = {config.teacher.path!r} names a model or an adapter, which worker.name = "
                          "\"debug\" cannot load; name a nanoverl checkpoint or run directory of a debug run, or use "
                          "worker.name = \"hf\"")


make_workers.check_config = check_config


def make_rollout(config: Config, workers: Workers) -> DebugRollout:
    return DebugRollout(config, workers)
