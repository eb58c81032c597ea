"""Turning responses into scores: one reward or several with weights, in worker processes, safely.

A reward is a registered name (`reward.name`), a function in a file the user names (`reward.file`,
which runs that file's code: a warning says so; a verl-style `compute_score(data_source,
solution_str, ground_truth, extra_info)`, or one taking only some of those names, and a TRL reward
function `(prompts, completions, **kwargs) -> list[float]` run unchanged), or several of either with weights
(`[[reward.components]]`): the score is the weighted sum, each component is logged as
`reward/<name>/mean`; the training stage also hands each component's own score and weight on
(`component_scores`, `component_weights`, (B, K)) for estimators that use them (gdpo).

Where the calls run (`pool.py` the worker pool, on nanoverl_core.processes; `calls.py` the call conventions):
  * per-row rewards run in `reward.workers` worker processes (default), so a reward that hangs,
    segfaults, calls `os._exit` or leaks memory costs one call and one worker, never the run;
  * a *batched* reward (`fn.batched = True`: lists of prompts, responses and rows in, a list of
    scores out, e.g. the reward model of nanoverl-hf) runs once per step in one worker process of its
    own (one for all batched rewards), so its model is loaded once and kept, and a crash or a hang
    costs that step's call (each of its rows fails), not the run; so does a TRL reward function
    (batched by contract; a None in its list scores 0, as in TRL's sum over functions);
  * `reward.workers = 0`, and a function no worker can import (registered in code as a closure, or
    from `__main__`), are called in the trainer process (a timeout then holds only in the main thread,
    and a crash takes the run with it).

Every failed call (raised, timed out, not a finite number, its worker died or ran out of memory, or a
batched reward failed the row with a kind of its own) either stops the run naming the row
(`reward.on_error = "raise"`, exit 2), or scores 0 (`"zero"`), or takes the row out of training
(`"drop"`: `reward_dropped`, its own uid, no tokens in the loss_mask); a failure is counted in `reward/errors`
and `reward/errors/<kind>` (`reward/timeouts`, `reward/crashes`), and the row, the response and the error go
to `reward_errors.jsonl` in the run directory.

`RewardScorer.score_batch` is the one way a batch is scored: the trainer's reward stage, ReMax's greedy
baseline, validation and `nanoverl-train eval` (`nanoverl_core.testing.score_texts` scores plain texts
through it). Training and the baseline add DAPO's soft overlong penalty (`reward.overlong_buffer_len`);
masking truncated responses out of the loss (`algorithm.mask_truncated`) is the trainer's loss-mask stage,
from the rollout's own `truncated` flags.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections import defaultdict
from pathlib import Path

import attrs
import torch

from ..batch import RLBatch, is_episodes, model_tokens
from ..config import RewardConfig
from ..dist import gather_dicts, rank_rows
from ..errors import RewardError, removed
from ..plugins import Registry
from ..rollout import decode_responses
from .calls import (BATCHED_STYLES, CallError, CallTimeout, ComponentSpec, RewardContext, call_batched, call_checked,
                    call_style, check_signature, importable_ref, load_function)
from .pool import RewardPool


def component_specs(cfg: RewardConfig) -> list[ComponentSpec]:
    """The configured rewards: [[reward.components]], or the one reward.name / reward.file (weight 1)."""
    settings = cfg.settings if isinstance(cfg.settings, dict) else {}
    if cfg.components:
        return [ComponentSpec(c.label, c.name, c.file, c.function, None if c.file else settings.get(c.name), c.weight)
                for c in cfg.components]
    if cfg.file:
        return [ComponentSpec(f"{cfg.file}:{cfg.function}", file=cfg.file, function=cfg.function)]
    return [ComponentSpec(cfg.name, name=cfg.name, settings=cfg.settings)]


def load_reward_fn(cfg: RewardConfig, registry: Registry):
    """(function, label) of the single reward.name / reward.file (for scripts and tests)."""
    (spec,) = component_specs(attrs.evolve(cfg, components=[]))
    return (load_function(spec) if spec.file else registry.get("reward", spec.name, key="reward.name")), spec.where


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer_len: int, factor: float) -> torch.Tensor:
    """DAPO's soft overlong punishment (verl overlong_buffer): min(-(L - (max_len - buffer_len)) / buffer_len
    * factor, 0) for each response length L (B,); 0 inside max_len - buffer_len, -factor at max_len."""
    exceed = lengths.float() - (max_len - buffer_len)
    return torch.clamp(-exceed / buffer_len * factor, max=0.0)


_REMOVED_ENTRIES = ("score", "score_components", "score_responses")
"""0.2.0's entry points, deprecated in 0.3.0, gone in 0.4.0: calling one is one line naming score_batch."""


def _alarm(_signum, _frame):
    raise CallTimeout


class RewardScorer:
    """Scores (B,) for a batch's responses under reward.on_error, with the metrics of each call."""

    def __init__(self, cfg: RewardConfig, registry: Registry, *, run_dir: str | Path | None = None,
                 max_new_tokens: int = 0, score_answer: bool = True, prompt_key: str = "prompt"):
        self.cfg, self.max_new_tokens, self.prompt_key = cfg, max_new_tokens, prompt_key
        self.score_answer = score_answer
        """False: a multi-turn episode's score is its environment's rewards alone (environment.score_answer)."""
        self.specs, self.fns = [], []
        for i, spec in enumerate(component_specs(cfg)):  # loaded here too: a bad name or file fails at once
            if spec.file:
                if Path(spec.file).is_file():
                    print(f"warning: reward.file runs the Python code in {spec.file}; only use files you trust",
                          file=sys.stderr)
                fn = load_function(spec)
            else:
                key = f"reward.components[{i}].name" if cfg.components else "reward.name"
                fn = registry.get("reward", spec.name, key=key)
                spec = attrs.evolve(spec, ref=importable_ref(fn))
            self.specs.append(spec)
            self.fns.append(fn)
        self.styles = [call_style(fn) for fn in self.fns]
        self.error_kinds = list(dict.fromkeys(kind for fn in self.fns for kind in getattr(fn, "error_kinds", ())))
        """The failure kinds the rewards declare (fn.error_kinds), each logged as reward/errors/<kind> every step."""
        for fn, style, spec in zip(self.fns, self.styles, self.specs):
            check_signature(fn, style, spec.where)
        self.in_trainer = [cfg.workers == 0 or not (spec.file or spec.ref) for spec in self.specs]
        """Components called in this process: all with reward.workers = 0, and functions a worker cannot import
        (registered in code as a closure or from __main__). The others run in worker processes: per-row
        rewards in the pool of reward.workers, batched ones (a reward model, TRL's) in a pool of one, so a
        model is loaded once, and a crash or a hang costs that step's call, not the run."""
        self.label = self.specs[0].where if len(self.specs) == 1 else "+".join(s.label for s in self.specs)
        self.run_dir = "" if run_dir is None else str(run_dir)
        """Handed to batched rewards (RewardContext.run_dir) for files of their own; "" writes nothing."""
        self.errors_path = Path(run_dir) / "reward_errors.jsonl" if run_dir is not None else None
        """Where failed calls are written; None writes nothing (`nanoverl-train eval`)."""
        self._pool: RewardPool | None = None
        self._batch_pool: RewardPool | None = None

    # ---- calls ------------------------------------------------------------------------------------------
    def _pooled(self) -> list[int]:
        return [c for c, here in enumerate(self.in_trainer) if not here]

    def pool(self) -> RewardPool:
        """The worker processes of per-row rewards, started on first use (so --dry-run starts none)."""
        if self._pool is None:
            self._pool = RewardPool(self.specs, self.cfg.workers, self.cfg.timeout_s, self.cfg.memory_limit_mb,
                                    self.prompt_key)
        return self._pool

    def batch_pool(self) -> RewardPool:
        """The one worker process of batched rewards: one call a step, the model loaded once and kept."""
        if self._batch_pool is None:
            self._batch_pool = RewardPool(self.specs, 1, self.cfg.timeout_s, self.cfg.memory_limit_mb, self.prompt_key)
        return self._batch_pool

    def _run_batched(self, components: list[int], args: list[tuple], rows: list[int], stop: bool,
                     context: RewardContext) -> dict:
        """Outcomes by (row, component) of batched components, one call each in the batch worker, whose time
        limit is reward.timeout_s per row; a call that crashes or times out fails each of its rows."""
        ran = self.batch_pool().run([(c, c, ([args[i] for i in rows], context)) for c in components], stop,
                                    timeout_s=self.cfg.timeout_s * len(rows))
        outcomes = {}
        for c, (kind, value, _) in ran.items():
            failed = (kind, f"{value} (the batched call of {len(rows)} rows)", None)
            each = value if kind == "ok" else [failed] * len(rows)
            outcomes.update({(i, c): o for i, o in zip(rows, each)})
        return outcomes

    def _in_process(self, c: int, args: tuple) -> tuple:
        """One call in this process; the timeout is SIGALRM, so it holds only in the main thread."""
        timed = self.cfg.timeout_s > 0 and threading.current_thread() is threading.main_thread()
        if timed:
            previous = signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, self.cfg.timeout_s)
        try:
            return ("ok", *call_checked(self.fns[c], self.styles[c], self.specs[c], *args))
        except CallError as exc:
            return (exc.kind, exc.message, None)
        except CallTimeout:
            return ("timeout", f"timed out after reward.timeout_s={self.cfg.timeout_s:g}s", None)
        finally:
            if timed:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)

    def close(self) -> None:
        """Stop the worker processes (they restart on the next call)."""
        for pool in (self._pool, self._batch_pool):
            if pool is not None:
                pool.close()
        self._pool = self._batch_pool = None

    # ---- scoring ----------------------------------------------------------------------------------------
    def score_batch(self, batch: RLBatch, tokenizer, step: int | None = None, *,
                    phase: str = "train") -> tuple[RLBatch, dict[str, float]]:
        """The one way a batch is scored: the trainer's reward stage (phase "train"), ReMax's greedy baseline
        ("baseline"), validation and `nanoverl-train eval` ("val") and `nanoverl-train score` ("score").

        Each row's response (decoded with `tokenizer`; a multi-turn episode's last model turn) is scored by
        [reward] (an episode's answer score is 0 with score_answer off, and for an episode whose environment
        failed). Returns the columns response_text, score (B,) and token_level_scores (B, R), each score on
        its row's last response token (an episode's: its last model token, plus each environment reward on
        the turn it answered; its score is their sum), with the overlong penalty
        (reward.overlong_buffer_len) added in training and the baseline, not in validation or `score`;
        reward_detail, each row's dict of the extra keys its rewards returned (under their metric names) and
        "error" for a failed call; with [[reward.components]] also component_scores and component_weights
        (B, K), each component's own score (before its weight) and its weight. And the metrics: reward/mean,
        reward/std, reward/errors, reward/errors/<kind>, reward/timeouts, reward/crashes, the batch mean of every
        extra key a reward returns (reward/<key>; with components reward/<name>/<key>) and, with components, each
        one's mean (reward/<name>/mean). Training under reward.on_error = "drop" adds reward_dropped (B,) and
        a uid of its own for each failed row (`drop_failed`), and reward/mean and reward/std leave them out."""
        texts = decode_responses(tokenizer, batch)
        scores, metrics, components, rows = self._answer_scores(batch, texts, phase, step)
        mask = batch["response_mask"]
        if self.max_new_tokens and self.cfg.overlong_buffer_len and phase in ("train", "baseline"):
            penalty = overlong_penalty(mask.sum(-1), self.max_new_tokens, self.cfg.overlong_buffer_len,
                                       self.cfg.overlong_penalty_factor)
            scores = scores + penalty
            metrics["reward/overlong_penalty/mean"] = float(penalty.mean())
        token_scores = place_scores(scores, model_tokens(batch) if is_episodes(batch) else mask)  # an episode's: its last model token
        if is_episodes(batch):
            token_scores = token_scores + batch["turn_rewards"]
            scores = token_scores.sum(-1)
        tensors = {"score": scores, "token_level_scores": token_scores}
        columns = {"response_text": texts, "reward_detail": rows}
        kept = scores
        if self.cfg.on_error == "drop" and phase == "train":
            tensors["reward_dropped"], columns["uid"] = drop_failed(batch["uid"], rows)
            kept, metrics["reward/dropped"] = scores[~tensors["reward_dropped"]], float(tensors["reward_dropped"].sum())
        metrics["reward/mean"] = float(kept.mean()) if len(kept) else 0.0
        metrics["reward/std"] = float(kept.std()) if len(kept) > 1 else 0.0
        if self.cfg.components:
            weights = torch.tensor([spec.weight for spec in self.specs], dtype=torch.float32)
            tensors.update(component_scores=components, component_weights=weights.expand(len(scores), -1).clone())
        return RLBatch(tensors, columns), metrics

    def __getattr__(self, name: str):
        if name in _REMOVED_ENTRIES:        # 0.2.0's entry points (deprecated in 0.3.0)
            raise removed(f"RewardScorer.{name}", "write score_batch(batch, tokenizer, step, phase=...), the one "
                          "entry point (nanoverl_core.testing.score_texts(scorer, batch, texts) scores plain texts "
                          "through it)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _answer_scores(self, batch: RLBatch, texts: list[str], phase: str, step: int | None
                       ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor, list[dict]]:
        """[reward] on each row's response text: scores (B,), metrics, each component's score (B, K) and each
        row's detail (`_call_rewards`); for a multi-turn episode 0 with score_answer off and for an episode
        whose environment failed (which also goes to reward_errors.jsonl). The environment's rewards are the batch's `turn_rewards`."""
        episodes = is_episodes(batch)
        if episodes and not self.score_answer:
            scores, metrics = torch.zeros(len(batch)), {}
            components, rows = torch.zeros(len(batch), len(self.specs)), [{} for _ in range(len(batch))]
        else:
            scores, metrics, components, rows = self._call_rewards(batch, texts, phase, step)
        if episodes and bool(batch["episode_failed"].any()):
            scores = scores.masked_fill(batch["episode_failed"], 0.0)
            components = components.masked_fill(batch["episode_failed"][:, None], 0.0)
            self._write_episode_failures(batch, phase, step)
        return scores, metrics, components, rows

    def _call_rewards(self, batch: RLBatch, response_texts: list[str], phase: str, step: int | None
                      ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor, list[dict]]:
        """Every configured reward on every row: scores (B,), metrics, each component's own score (B, K) (0 for
        a failed call; K = 1 without components) and each row's detail: a dict of the extra keys its rewards
        returned, under their metric names (reward/<key>, with components reward/<name>/<key> and each
        component's score as reward/<name>/mean), and "error" (what went wrong, with the kind) for a failed call.

        Under torchrun each rank calls the rewards on its own share of the rows (`dist.rank_rows`; a
        batched reward, such as a reward model, gets that share as its batch) and the outcomes are
        gathered, so every rank combines the same outcomes into the same scores and metrics, and a
        failure stops every rank alike, while the reward work is split N ways instead of done N times."""
        n, stop = len(response_texts), self.cfg.on_error == "raise"
        sources = batch.non_tensors.get("data_source") or ["default"] * n
        args = [(batch["prompt_text"][i], response_texts[i], batch["row"][i], sources[i]) for i in range(n)]
        rows, real = rank_rows(n)
        mine = rows[:real]
        uids = batch.non_tensors.get("uid") or [str(i) for i in range(n)]
        indices = batch.non_tensors.get("index") or list(range(n))
        context = RewardContext(phase, step, self.run_dir, tuple(str(uids[i]) for i in mine),
                                tuple(int(indices[i]) for i in mine))
        outcomes: dict[tuple[int, int], tuple] = {}
        pooled = self._pooled()
        per_row = [c for c in pooled if self.styles[c] not in BATCHED_STYLES]
        batched = [c for c in pooled if self.styles[c] in BATCHED_STYLES]
        if per_row:
            outcomes.update(self.pool().run([((i, c), c, args[i]) for c in per_row for i in mine], stop))
        if batched and mine:
            outcomes.update(self._run_batched(batched, args, mine, stop, context))
        for c in range(len(self.specs)):
            if c not in pooled:
                outcomes.update(self._run_here(c, args, mine, stop, context))
        return self._combine(batch, response_texts, gather_dicts(outcomes), phase, step)

    def _run_here(self, c: int, args: list[tuple], mine: list[int], stop: bool, context: RewardContext) -> dict:
        """Outcomes by (row, component) of component c called in this process: a batched one once, a per-row
        one row by row (stopping at the first failure under reward.on_error = "raise")."""
        if self.styles[c] in BATCHED_STYLES:
            calls = [args[i] for i in mine]
            return dict(zip([(i, c) for i in mine], call_batched(self.fns[c], self.styles[c], self.specs[c], calls,
                                                                 self.prompt_key, context)))
        outcomes = {}
        for i in mine:
            outcomes[(i, c)] = self._in_process(c, args[i])
            if stop and outcomes[(i, c)][0] != "ok":
                break
        return outcomes

    def _combine(self, batch, texts, outcomes, phase, step) -> tuple[torch.Tensor, dict[str, float], torch.Tensor,
                                                                    list[dict]]:
        n, many = len(texts), len(self.specs) > 1
        scores, extras, per_component, rows = [0.0] * n, defaultdict(list), [], [{} for _ in range(n)]
        counts = {"errors": 0, "timeouts": 0, "crashes": 0, **{f"errors/{kind}": 0 for kind in self.error_kinds}}
        failures = sorted((key, o) for key, o in outcomes.items() if o[0] != "ok")
        if failures:
            self._write_failures(batch, texts, failures, phase, step)
        if failures and self.cfg.on_error == "raise":
            (i, c), (kind, message, _) = failures[0]
            where = self.specs[c].where if many else self.label
            raise RewardError(f"reward {where} on data row {batch['index'][i]}: {message}; fix the reward, or set "
                              f"reward.on_error=zero (score such rows 0) or drop (leave them out of the loss)" +
                              (f" (the row is in {self.errors_path})" if self.errors_path else ""))
        for c, spec in enumerate(self.specs):
            prefix = f"reward/{spec.label}/" if many else "reward/"
            values = []
            for i in range(n):
                kind, value, extra = outcomes[(i, c)]
                if kind != "ok":
                    counts["errors"] += 1
                    counts["timeouts"] += kind == "timeout"
                    counts["crashes"] += kind == "crash"
                    counts[f"errors/{kind}"] = counts.get(f"errors/{kind}", 0) + 1
                    message = value if str(value).startswith(kind) else f"{kind}: {value}"
                    rows[i]["error"] = message + (f" ({spec.label})" if many else "")
                    value, extra = 0.0, {}
                scores[i] += spec.weight * value
                values.append(value)
                for key, v in extra.items():
                    extras[prefix + key].append(v)
                    rows[i][prefix + key] = v
                if many:
                    rows[i][prefix + "mean"] = value
            per_component.append(values)
            if many:
                extras[prefix + "mean"] = values
        metrics = {key: sum(v) / len(v) for key, v in extras.items()}
        metrics.update({f"reward/{k}": float(v) for k, v in counts.items()})
        return (torch.tensor(scores, dtype=torch.float32), metrics, torch.tensor(per_component, dtype=torch.float32).T,
                rows)

    def _append_errors(self, records: list[dict]) -> None:
        """Append records to reward_errors.jsonl (rank 0 only: every rank holds every row's outcome)."""
        from ..dist import is_rank0

        if self.errors_path is None or not is_rank0():
            return
        self.errors_path.parent.mkdir(parents=True, exist_ok=True)
        with self.errors_path.open("a") as f:
            f.writelines(json.dumps(record, default=str) + "\n" for record in records)

    def _write_failures(self, batch, texts, failures, phase, step) -> None:
        """Each failed call, with its row and response."""
        self._append_errors([{"phase": phase, "step": step, "index": batch["index"][i], "reward": self.specs[c].label,
                              "kind": kind, "message": message, "prompt": batch["prompt_text"][i],
                              "response": texts[i], "row": batch["row"][i]}
                             for (i, c), (kind, message, _) in failures])

    def _write_episode_failures(self, batch: RLBatch, phase: str, step: int | None) -> None:
        """Each failed episode (environment.on_error = "zero"), with its turns."""
        self._append_errors([{"phase": phase, "step": step, "index": batch["index"][i], "reward": "environment",
                              "kind": error.split(": ", 1)[0], "message": error.split(": ", 1)[1],
                              "prompt": batch["prompt_text"][i], "episode": batch["episode"][i], "row": batch["row"][i]}
                             for i, error in enumerate(batch["episode_error"]) if error is not None])


def drop_failed(uids: list, rows: list[dict]) -> tuple[torch.Tensor, list]:
    """reward.on_error = "drop": (reward_dropped (B,) bool, uids) where each row whose reward call failed (its
    detail has "error") is dropped and gets a uid of its own ("<uid>/dropped/<row>"), so a group estimator
    computes the other rows' baselines without it; stage 4b takes its tokens out of the loss_mask."""
    dropped = torch.tensor(["error" in row for row in rows], dtype=torch.bool)
    return dropped, [f"{uid}/dropped/{i}" if gone else uid for i, (uid, gone) in enumerate(zip(uids, dropped.tolist()))]


def place_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) sequence scores -> (B, R) token-level scores on each row's last valid response token."""
    out = torch.zeros_like(response_mask, dtype=torch.float32)
    last = (response_mask.cumsum(-1) * response_mask).argmax(-1)  # index of the last 1
    out[torch.arange(len(scores)), last] = scores * (response_mask.sum(-1) > 0)
    return out
