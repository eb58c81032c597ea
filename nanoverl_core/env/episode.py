"""Multi-turn episodes: the model acts, an environment answers, over any rollout engine.

With `environment.name` set, the trainer wraps the selected rollout (`rollout.name`: debug, hf,
vllm, ...) in an `EpisodeRollout`. Each turn it asks the engine for one model turn for every episode
still running, handing it the episode's token ids so far as the prompt (token-in), keeps the ids the
engine sampled exactly (token-out), gives the environment the turn, and appends the environment's
answer rendered once (env/render.py). Nothing is re-tokenised, so the trainer trains on the very
ids the sampler produced, and the engine's log-probs stay aligned with them.

Each turn's batch carries `episode_key` (B,) int64, one value per episode. An engine with a `turn_cache`
context manager (the `hf` rollout) is held in it for the batch of episodes, and may keep each episode's KV
cache from one turn to the next and prefill only the new tokens (nanoverl_core.protocols.Rollout); any other
engine gets the whole conversation as its prompt each turn (vLLM finds it in its prefix cache).

An episode ends when the environment says done, after `environment.max_turns` model turns, or when
the response budget (`rollout.max_new_tokens`, model and environment tokens together) runs out; then
it is `truncated`. It always ends with a model turn: the environment's answer to the last turn is
not appended (its reward counts).

What `generate` returns, beyond a single-turn rollout's columns (nanoverl_core.rollout):

    response_mask (B, R)  every token of the episode after the prompt, the environment's included
    model_mask (B, R)     1 on the model's tokens, 0 on the environment's; the trainer's loss_mask starts
                          from it (nanoverl_core.batch)
    rollout_log_probs     (B, R) over the model's tokens (0 elsewhere), when the engine returns them
    turn_rewards (B, R)   each environment reward x environment.reward_weight, on the last token of
                          the model turn it answered (GAE sees each turn's reward where it was earned);
                          all 0 for an episode whose environment failed
    num_turns (B,)        model turns (its presence marks a batch of episodes: nanoverl_core.batch.is_episodes)
    episode_failed (B,)   the environment failed (environment.on_error = "zero"): the row scores 0
    episode_error         per row, the failure ("kind: message"), or None
    final_text            the last model turn's text, what [reward] scores (environment.score_answer)
    episode               per row, the turns in order: who said what, and each turn's reward
    episode_info          per row, the environment's counters summed over turns (tool_calls, ...)

The environments live where `calls` runs them (env/pool.py: worker processes, or this process), one
round of calls per stage: every episode's start, each turn's steps, the closes. An environment that
raises, hangs past `environment.timeout_s`, kills its worker, returns something that is not an
`EnvStep`, or answers with something that cannot be rendered stops the run naming the row and turn
(`environment.on_error = "raise"`, exit 2), or ends that episode with score 0, counted in
`episode/errors` and written to reward_errors.jsonl (`"zero"`). A malformed tool call is not such a
failure: it is the model's mistake, and a tool environment answers it with an error message.
"""

from __future__ import annotations

import itertools
import sys
from collections import Counter
from contextlib import nullcontext
from typing import Any

import attrs
import torch

from ..batch import RLBatch
from ..errors import EpisodeError, UserError
from ..rollout import SamplingParams, stop_token_ids
from .contract import EnvStep, Turn
from .render import render_answer

SEED_STRIDE = 1_000_003
"""Turn t of a row seeded by a `sample_seed` column samples with `sample_seed + t * SEED_STRIDE`."""


@attrs.define
class Episode:
    """One row's episode as it runs: the ids after the prompt, whose they are, and what was said."""

    prompt: list[int]
    key: int
    """The episode's key where its environment lives (unique over the run)."""
    tokens: list[int] = attrs.Factory(list)
    model: list[bool] = attrs.Factory(list)
    """Per token of `tokens`: sampled by the model (trained on) or written by the environment."""
    log_probs: list[float] = attrs.Factory(list)
    rewards: list[tuple[int, float]] = attrs.Factory(list)
    """(index in `tokens` of the turn's last token, reward)."""
    turns: list[dict[str, Any]] = attrs.Factory(list)
    info: Counter = attrs.Factory(Counter)
    num_turns: int = 0
    final_text: str = ""
    done: bool = False
    truncated: bool = False
    error: str | None = None

    def add(self, ids: list[int], model: bool, log_probs: list[float] | None = None) -> None:
        self.tokens += ids
        self.model += [model] * len(ids)
        self.log_probs += list(log_probs) if log_probs is not None else [0.0] * len(ids)


class EpisodeRollout:
    """A rollout (the `Rollout` protocol) that runs multi-turn episodes on another rollout's engine."""

    def __init__(self, engine, calls, config, tokenizer, *, name: str):
        """`calls`: where the environments live and their calls run (nanoverl_core.env.pool: an
        EnvironmentPool of worker processes, or InProcess)."""
        self.engine, self.calls, self.tokenizer, self.name = engine, calls, tokenizer, name
        self.cfg, self.budget = config.environment, config.rollout.max_new_tokens
        self.keys = itertools.count()
        self.returns_log_probs = bool(getattr(engine, "returns_log_probs", False))
        own = getattr(engine, "eos_token_ids", None)          # the hf and vllm rollouts' own stop ids
        self.stop_ids = list(own or stop_token_ids(tokenizer, getattr(engine, "module", None)))
        """What ends a model turn."""

    def sync_weights(self, actor) -> None:
        self.engine.sync_weights(actor)

    def close(self) -> None:
        self.calls.close()
        self.engine.close()

    # ---- one batch of episodes -------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, batch: RLBatch, params: SamplingParams) -> RLBatch:
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(batch["prompts"], batch["prompt_mask"])]
        episodes = [Episode(prompt, next(self.keys)) for prompt in prompts]
        awake = getattr(self.engine, "awake", nullcontext)     # an engine that sleeps after each call stays up
        turn_cache = getattr(self.engine, "turn_cache", nullcontext)   # one that keeps KV caches frees them after
        started = self._round(batch, episodes, {i: ("start", batch["row"][i]) for i in range(len(episodes))}, "start")
        try:
            with awake(), turn_cache():
                self._run(batch, episodes, params)
        finally:
            self._round(batch, episodes, {i: ("close", None) for i in started}, "close")
        return self._to_batch(episodes)

    def _run(self, batch: RLBatch, episodes: list[Episode], params: SamplingParams) -> None:
        """One engine call per turn for the episodes still running, then one round of environment steps."""
        for turn in range(self.cfg.max_turns):
            live = [i for i, e in enumerate(episodes) if not e.done]
            if not live:
                return
            room = {i: self.budget - len(episodes[i].tokens) for i in live}
            limit = min(max(room.values()), self.cfg.max_turn_tokens or self.budget)
            out = self.engine.generate(self._turn_batch(batch, episodes, live, turn),
                                       attrs.evolve(params, max_new_tokens=limit))
            turns = {i: self._model_turn(episodes[i], out, j, min(room[i], limit), turn) for j, i in enumerate(live)}
            steps = {i: ("step", t) for i, t in turns.items() if t is not None}
            for i, step in self._round(batch, episodes, steps, f"turn {turn}").items():
                self._answer(batch, i, episodes[i], step, turn)

    def _turn_batch(self, batch: RLBatch, episodes: list[Episode], live: list[int], turn: int) -> RLBatch:
        """The live rows, each episode's ids so far as its (left-padded) prompt, and its key."""
        contexts = [episodes[i].prompt + episodes[i].tokens for i in live]
        width = max(len(c) for c in contexts)
        ids = torch.full((len(live), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(live), width), dtype=torch.long)
        for row, context in enumerate(contexts):
            ids[row, width - len(context):] = torch.tensor(context)
            mask[row, width - len(context):] = 1
        sub = batch.index(live)
        sub["prompts"], sub["prompt_mask"] = ids, mask
        sub["episode_key"] = torch.tensor([episodes[i].key for i in live])
        if "sample_seed" in sub:
            sub["sample_seed"] = sub["sample_seed"] + turn * SEED_STRIDE
        return sub

    def _model_turn(self, episode: Episode, out: RLBatch, j: int, room: int, turn: int) -> Turn | None:
        """Append row j of the engine's output to `episode`; the Turn its environment answers, or None when
        the budget cut it mid-turn (nothing to answer: the episode ends truncated)."""
        n = int(out["response_mask"][j].sum())
        ids = out["responses"][j, :n].tolist()[:room]
        log_probs = out["rollout_log_probs"][j, :len(ids)].tolist() if "rollout_log_probs" in out else None
        stopped = bool(ids) and ids[-1] in self.stop_ids
        episode.add(ids, True, log_probs)
        episode.num_turns += 1
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        episode.final_text = text
        episode.turns.append({"role": "model", "text": text, "tokens": len(ids)})
        out_of_room = len(episode.tokens) >= self.budget
        if out_of_room and not stopped:
            episode.done = episode.truncated = True
            return None
        return Turn(text, tuple(ids), turn, truncated=not stopped)

    def _answer(self, batch: RLBatch, i: int, episode: Episode, step: EnvStep, turn: int) -> None:
        """Record the environment's answer to episode i's turn: its reward, then its observation appended."""
        episode.rewards.append((len(episode.tokens) - 1, float(step.reward)))
        episode.info.update({k: float(v) for k, v in step.info.items()})
        episode.turns[-1]["reward"] = float(step.reward)
        if step.done or turn + 1 == self.cfg.max_turns:
            episode.done = True
            return
        answer = self._render(batch, i, episode, step.observation, turn)
        if answer is None:
            return
        ids, text = answer
        if len(episode.tokens) + len(ids) >= self.budget:  # no room left for the model to answer
            episode.done = episode.truncated = True
            return
        episode.add(ids, False)
        episode.turns.append({"role": "environment", "text": text, "tokens": len(ids)})

    # ---- calls into the environment, in rounds, each failure handled under environment.on_error ---------
    def _round(self, batch: RLBatch, episodes: list[Episode], calls: dict[int, tuple[str, Any]], where: str) -> dict:
        """Run one call per episode (`calls`: row -> (op, arg)) where the environments live; returns the values
        of the calls that succeeded, by row (a failed one ends its episode, or stops the run)."""
        outcomes = self.calls.run([(episodes[i].key, op, arg) for i, (op, arg) in calls.items()])
        values = {}
        for i, (op, _) in calls.items():
            kind, value = outcomes[episodes[i].key]
            if kind == "ok" and op == "step" and not isinstance(value, EnvStep):
                kind, value = "invalid", f"step() returned {type(value).__name__}, not nanoverl_core.env.EnvStep"
            if kind == "ok":
                values[i] = value
            elif op == "close":                           # a lost episode's environment is gone already
                if kind != "lost":
                    print(f"warning: environment {self.name!r}: close() failed ({value})", file=sys.stderr)
            else:
                self._fail(batch, i, episodes[i], where, kind, value)
        return values

    def _render(self, batch: RLBatch, i: int, episode: Episode, observation, turn: int):
        try:
            return render_answer(self.tokenizer, observation, self.stop_ids)
        except Exception as exc:
            detail = str(exc) if isinstance(exc, UserError) else f"raised {type(exc).__name__}: {exc}"
            return self._fail(batch, i, episode, f"turn {turn}", "invalid", f"its answer cannot be rendered: {detail}")

    def _fail(self, batch: RLBatch, i: int, episode: Episode, where: str, kind: str, detail: str) -> None:
        message = f"environment {self.name!r} on data row {batch['index'][i]}, {where}: {detail}"
        if self.cfg.on_error == "raise":
            raise EpisodeError(f"{message}; fix the environment, or set environment.on_error=zero to end such "
                               "episodes with score 0") from None
        episode.done, episode.error = True, f"{kind}: {message}"
        return None

    # ---- the batch the trainer sees -------------------------------------------------------------------
    def _to_batch(self, episodes: list[Episode]) -> RLBatch:
        width = max(1, max(len(e.tokens) for e in episodes))
        shape = (len(episodes), width)
        ids = torch.full(shape, self.tokenizer.pad_token_id, dtype=torch.long)
        response_mask, model_mask = torch.zeros(shape), torch.zeros(shape)
        log_probs, rewards = torch.zeros(shape), torch.zeros(shape)
        for row, e in enumerate(episodes):
            n = len(e.tokens)
            ids[row, :n] = torch.tensor(e.tokens, dtype=torch.long)
            response_mask[row, :n] = 1.0
            model_mask[row, :n] = torch.tensor(e.model, dtype=torch.float32)
            log_probs[row, :n] = torch.tensor(e.log_probs, dtype=torch.float32)
            for position, reward in e.rewards if e.error is None else ():   # a failed episode earns nothing
                rewards[row, position] += reward * self.cfg.reward_weight
        out = RLBatch({"responses": ids, "response_mask": response_mask, "model_mask": model_mask,
                       "truncated": torch.tensor([e.truncated for e in episodes]), "turn_rewards": rewards,
                       "num_turns": torch.tensor([e.num_turns for e in episodes]),
                       "episode_failed": torch.tensor([e.error is not None for e in episodes])},
                      {"final_text": [e.final_text for e in episodes], "episode": [e.turns for e in episodes],
                       "episode_info": [dict(e.info) for e in episodes],
                       "episode_error": [e.error for e in episodes]})
        if self.returns_log_probs:
            out["rollout_log_probs"] = log_probs
        return out


def episode_metrics(batch: RLBatch) -> dict[str, float]:
    """episode/turns/mean, episode/env_tokens/mean (environment tokens per episode), episode/errors, and
    for every counter the environment reports (tool_calls, tool_errors, ...) episode/<counter>/mean (per
    episode) and episode/<counter>/rate (the share of episodes where it is above 0). Environment tokens are
    the rollout's facts (response_mask less model_mask), whatever the trainer's loss_mask counts."""
    env_tokens = (batch["response_mask"] - batch["model_mask"]).clamp(min=0).sum(-1)
    out = {"episode/turns/mean": float(batch["num_turns"].float().mean()),
           "episode/env_tokens/mean": float(env_tokens.float().mean()),
           "episode/errors": float(batch["episode_failed"].sum())}
    infos = batch["episode_info"]
    for key in sorted({k for info in infos for k in info}):
        out[f"episode/{key}/mean"] = sum(info.get(key, 0.0) for info in infos) / len(infos)
        out[f"episode/{key}/rate"] = sum(info.get(key, 0.0) > 0 for info in infos) / len(infos)
    return out
