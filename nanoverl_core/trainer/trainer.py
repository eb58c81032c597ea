"""The synchronous trainer: one RL step, top to bottom, in the order README.md lists ("How a training step works").

    1. load a batch of prompts            7. token-level rewards and advantages
    2. expand each prompt n times         8. update the critic
    3. rollout                            9. update the actor
    4. reward                            10. sync rollout weights
    5. old log-probs                     11. log (with the rollout mismatch), validate, checkpoint
    6. reference log-probs and values

With algorithm.filter_groups, steps 1-4 run in rounds until the batch holds data.batch_size groups
whose scores differ (`generate_until_full`, DAPO's dynamic sampling). An estimator that reads a greedy
baseline (ReMax) gets one greedy response per prompt of the kept groups, scored (4c, `greedy_baseline` in baseline.py).

Each stage is one named call, timed into ``timing/<stage>``, that takes what it needs and returns what it
adds to the batch; the step assigns it. What the rollout reports (``response_mask``, an episode's
``model_mask``) never changes; ``loss_mask`` (what the update counts) is derived at 4b and narrowed by
rollout correction (6b; each column: nanoverl_core/batch.py). Everything the step needs is resolved from
the registry before the first model loads, and which optional passes it runs is decided then too
(`plan.py`, printed by --dry-run).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import torch

from ..algos import (apply_kl_penalty, compute_rollout_correction, filter_uniform_groups, first_groups, kl_penalty,
                     make_kl_controller, masked_mean, rollout_mismatch_metrics)
from ..batch import RLBatch, derive_loss_mask, is_episodes
from ..config import Config
from ..data import PromptLoader, load_split
from ..dist import is_rank0, seed_everything, shard_rollout
from ..errors import CheckpointError, NonFiniteError, RolloutError
from ..plugins import Registry
from ..processes import release_free_heap
from ..rollout import SamplingParams, check_rollout_columns, rollout_rows
from ..workers import compile_metrics
from ..workers.precision import resolve_compute_dtype
from .batches import (batch_metrics, concat_rounds, expand, informative_groups, merge_reward_metrics, rollout_metrics,
                      timed)
from .checkpoint import (changed_config, checkpoint_root, complete_checkpoints, config_differences, find_resume,
                         load_checkpoint, read_tracker_states, remove_new_entries, save_checkpoint, snapshot_run_dir,
                         write_run_config)
from .baseline import greedy_baseline
from .plan import plan_step
from .resolve import (build_rollout, build_workers, check_before_start, check_rollout_log_probs, check_val_rows,
                      prompt_tools, resolve_plugins)
from .validation import eval_before_after, validate


class Trainer:
    def __init__(self, config: Config, registry: Registry):
        self.config = cfg = config
        self.run_dir = Path(cfg.trainer.output_dir)
        resolve_compute_dtype(cfg)                          # "auto": what this machine computes fast in
        plugins = resolve_plugins(cfg, registry)
        self.estimator, self.reward, self.policy_loss = plugins["estimator"], plugins["reward"], plugins["policy_loss"]
        seed_everything(cfg.trainer.seed)
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)

        # Trackers first: a tracking store that cannot be reached fails before any model loads. A start
        # that fails (a bad data row, a model that cannot load) leaves the run directory as it found it.
        check_before_start(cfg, plugins)                                          # what --dry-run checks too
        resume_from = find_resume(cfg.trainer.resume, checkpoint_root(self.run_dir))
        tracker_states = read_tracker_states(resume_from) if resume_from else {}
        self.trackers, before = {}, snapshot_run_dir(self.run_dir)
        changed = config_differences(self.run_dir, cfg) if resume_from else []
        try:
            if is_rank0():
                write_run_config(self.run_dir, cfg, registry)
                for name, make in zip(cfg.tracking.trackers, plugins["trackers"]):
                    self.trackers[name] = make(cfg, self.run_dir, tracker_states.get(name, {} if resume_from else None))
            self._build(plugins, resume_from)
        except BaseException as exc:
            self._undo_start(before)
            if isinstance(exc, CheckpointError) and changed:              # the checkpoint is another config's
                raise CheckpointError(f"{exc}; {changed_config(changed)}") from None
            raise

    def _undo_start(self, before) -> None:
        """A start that failed leaves the run directory as it found it (and closes what it opened)."""
        if getattr(self, "rollout", None) is not None:  # built before the failing part (data, resume)
            self.rollout.close()
        self._tracker_call("close", False)
        if is_rank0():
            remove_new_entries(self.run_dir, before)

    def _build(self, plugins: dict[str, Any], resume_from: Path | None) -> None:
        cfg = self.config
        self.workers = build_workers(plugins, cfg)                                # its actor's update checked too
        self.tokenizer = self.workers.tokenizer
        self.rollout = build_rollout(plugins, cfg, self.workers)                  # multi-turn with an environment
        check_rollout_log_probs(cfg, self.rollout)
        tools = prompt_tools(plugins, self.tokenizer)                              # a tool environment's
        source = plugins["data_source"](cfg)                                      # data.source: files or a generator
        self.val_data = load_split(source, "val", cfg.data, self.tokenizer, tools=tools)
        if self.val_data is None:
            check_val_rows(cfg, 0)
        self.loader = PromptLoader(source, cfg.data, self.tokenizer, cfg.trainer.seed, tools=tools,
                                   exclude=frozenset(self.val_data.texts if self.val_data else ()))
        self.sampler = self.loader.sampler                                        # its state goes into checkpoints
        if cfg.trainer.total_epochs:                                              # steps, now that rows are counted
            cfg.trainer.total_steps = cfg.trainer.total_epochs * self.loader.steps_per_epoch
        self.kl_ctrl = make_kl_controller(cfg.algorithm)
        # which optional passes a step runs (plan.py): the plan of an updating step, and of a critic warmup step
        built = dict(reference=self.workers.reference is not None, critic=self.workers.critic is not None,
                     teacher=self.workers.teacher is not None, teacher_actor=self.workers.teacher,
                     rollout_log_probs=bool(getattr(self.rollout, "returns_log_probs", False)), actor=self.workers.actor)
        self.plan = plan_step(cfg, self.estimator, **built)
        self.warmup_plan = plan_step(cfg, self.estimator, **built, actor_update=False)
        self.step = 0
        if resume_from is not None:
            state = load_checkpoint(resume_from, self.workers)
            self.step = state["step"]
            self.sampler.load_state_dict(state["sampler"])
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])
            self.rollout.sync_weights(self.workers.actor)
            print(f"resumed from {resume_from} (step {self.step})", file=sys.stderr)

    # ---- the loop ----------------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        cfg, metrics = self.config.trainer, {}
        success = False
        try:
            if cfg.eval_before_after and self.step == 0:
                self.eval_table("before")
            if cfg.val_before_train and self.step == 0 and self.val_data is not None:
                self._tracker_call("log_metrics", self.validate(), 0)
            while self.step < cfg.total_steps:
                self.step += 1
                metrics = self.train_step()
                last = self.step == cfg.total_steps
                if self.val_data is not None and cfg.val_every and (self.step % cfg.val_every == 0 or last):
                    metrics.update(self.validate())
                    release_free_heap()     # as after each update: the next step (or the eval) does not sit on it
                self._tracker_call("log_metrics", metrics, self.step)
                if last or (cfg.save_every and self.step % cfg.save_every == 0):
                    self.save()
                    release_free_heap()
            if cfg.eval_before_after:
                self.eval_table("after")
            success = True
        except RolloutError as exc:
            saved = complete_checkpoints(checkpoint_root(cfg.output_dir))
            where = f"it resumes from {saved[-1]}" if saved else "no checkpoint was saved yet: it starts over"
            raise RolloutError(f"step {self.step}: {exc} ({where})") from None
        finally:
            self.rollout.close()
            self.reward.close()                                                 # the reward worker processes
            self._tracker_call("close", success)
        return metrics

    def train_step(self) -> dict[str, float]:
        """One step of the training order above; which optional passes run is `self.plan`'s (plan.py)."""
        plan = self.plan if self.step > self.config.trainer.critic_warmup else self.warmup_plan
        workers, timing, metrics = self.workers, {}, {}
        with timed(timing, "step"):
            batch, generated_metrics = self.generate_until_full(timing)         # 1-4 (rounds of them when
            metrics.update(generated_metrics)                                   #      filter_groups refills)
            if len(batch) == 0:
                print(f"warning: step {self.step}: every group had equal rewards in "
                      f"{metrics['filter/rounds']:.0f} rounds; no update", file=sys.stderr)
                return {**metrics, **{f"timing/{k}": v for k, v in timing.items()}}
            if plan.greedy_baseline:                                            # 4c. ReMax's baseline
                metrics.update(added(batch, self.greedy_baseline(batch, timing)))
            with timed(timing, "old_log_probs"):                                # 5. (~0 s on-policy: the
                batch.update(self.old_log_probs(batch, plan))                   #    update's own forward)
            for column, frozen_pass in self.frozen_passes(plan):                # 6. reference, teacher
                with timed(timing, column):
                    batch.update(frozen_pass(batch))
            if plan.critic:
                with timed(timing, "values"):
                    batch["values"] = workers.critic.compute_values(batch)
            if plan.rollout_correction:
                with timed(timing, "rollout_correction"):
                    metrics.update(added(batch, self.correct_rollout(batch)))   # 6b. IS weights, rejection
            with timed(timing, "advantages"):
                metrics.update(added(batch, self.compute_advantages(batch)))    # 7.
            with self.nonfinite_guard(metrics):
                if plan.critic:
                    with timed(timing, "critic_update"):
                        metrics.update(workers.critic.update(batch))            # 8.
                if plan.actor_update:
                    with timed(timing, "actor_update"):                         # 9. (on-policy: pi_old's
                        metrics.update(added(batch, self.update_actor(batch, plan)))  # log-probs with it)
                    with timed(timing, "weight_sync"):
                        self.rollout.sync_weights(workers.actor)                # 10.
            if plan.mismatch and "old_log_probs" in batch:                      # (absent: the update was skipped)
                with timed(timing, "rollout_correction"):
                    metrics.update(self.rollout_mismatch(batch))                # 11. the engine against pi_old
            release_free_heap()                          # the update's freed activations go back before the rollout
        metrics.update(batch_metrics(batch, timing, metrics))                   # 11. (logged by fit)
        if self.config.model.compile:
            metrics.update(compile_metrics())                    # graphs and seconds so far: a storm shows
        self.write_rollouts(batch)
        return metrics

    @contextmanager
    def nonfinite_guard(self, metrics: dict[str, float]):
        """A non-finite loss or gradient (the worker did not step): stop, or skip and count it."""
        try:
            yield
        except NonFiniteError as exc:
            if self.config.trainer.on_nonfinite == "stop":
                raise NonFiniteError(f"step {self.step}: {exc}; stopped (trainer.on_nonfinite=stop), the newest "
                                     "checkpoint is intact; lower the learning rate or check the rewards and "
                                     "resume, or set trainer.on_nonfinite=skip to drop such updates") from None
            print(f"warning: step {self.step}: {exc}; skipped (trainer.on_nonfinite=skip)", file=sys.stderr)
            metrics["actor/skipped_updates"] = 1.0

    # ---- the stages ----------------------------------------------------------------------------------
    def generate_round(self, timing: dict[str, float], gen_round: int = 0) -> tuple[RLBatch, dict[str, float]]:
        """Steps 1-4 once: data.batch_size prompts from the loader, rollout.n samples each, their responses,
        scores and loss_mask; and the reward metrics."""
        with timed(timing, "data"):
            batch = expand(self.next_batch(), self.config.rollout.n)           # 1-2. prompts, n samples each
        with timed(timing, "rollout"):
            batch = rollout_rows(batch, self.generate(batch, gen_round), split_rows=True)   # 3. responses
        with timed(timing, "reward"):
            scored, reward_metrics = self.score(batch)                         # 4. sequence scores
            batch.update(scored)
        batch["loss_mask"] = derive_loss_mask(batch, self.config.algorithm.mask_truncated)  # 4b. what counts
        return batch, reward_metrics

    def generate_until_full(self, timing: dict[str, float]) -> tuple[RLBatch, dict[str, float]]:
        """The batch to train on, and the rollout/ and reward/ metrics of everything sampled for it.

        Without algorithm.filter_groups: one round (`generate_round`). With it, DAPO's dynamic sampling:
        rounds of fresh prompts until data.batch_size groups have scores that are not all equal, or
        algorithm.filter_groups_max_rounds rounds ran; the batch is the informative groups in sampling
        order, cut to data.batch_size groups. filter/rounds, filter/kept_groups, filter/batch_full (0
        when the rounds ran out first) and rollout/filtered_groups (the uniform groups dropped) say how it went.
        """
        alg, size = self.config.algorithm, self.config.data.batch_size
        batch, reward_metrics = self.generate_round(timing)
        if not alg.filter_groups:
            return batch, {**rollout_metrics(batch), **reward_metrics}
        rounds, round_metrics, informative = [batch], [reward_metrics], informative_groups(batch)
        while informative < size and len(rounds) < alg.filter_groups_max_rounds:
            batch, reward_metrics = self.generate_round(timing, gen_round=len(rounds))
            rounds.append(batch)
            round_metrics.append(reward_metrics)
            informative += informative_groups(batch)
        generated = concat_rounds(rounds, self.tokenizer.pad_token_id)
        kept, dropped = filter_uniform_groups(generated, generated["score"])
        kept = first_groups(kept, size)                                         # verl: batch[:batch_size * n]
        kept_groups = min(informative, size)
        return kept, {**rollout_metrics(generated), **merge_reward_metrics(round_metrics, generated["score"]),
                      "rollout/filtered_groups": float(dropped), "filter/rounds": float(len(rounds)),
                      "filter/kept_groups": float(kept_groups), "filter/batch_full": float(kept_groups == size)}

    def greedy_baseline(self, batch: RLBatch, timing: dict[str, float]) -> tuple[RLBatch, dict[str, float]]:
        """Step 4c: reward_baselines (B,), each prompt's greedy response scored (baseline.py), and remax/ metrics."""
        return greedy_baseline(batch, self.rollout, self.reward, self.tokenizer, self.sampling(),
                               self.config.trainer.seed, self.step, timing)

    def next_batch(self) -> RLBatch:
        return self.loader.next_batch(self.tokenizer.pad_token_id)

    def old_log_probs(self, batch: RLBatch, plan) -> RLBatch:
        """old_log_probs (B, R), and sum_pi_squared (B, R) for an estimator that reads it; nothing when the
        on-policy update takes pi_old from its own forward (plan.old_log_probs "none" or "from_update")."""
        actor = self.workers.actor
        if plan.old_log_probs == "pass_with_sum_pi_squared":
            old, sum_pi_squared = actor.compute_log_probs_and_sum_pi_squared(batch)
            return RLBatch({"old_log_probs": old, "sum_pi_squared": sum_pi_squared})
        return RLBatch({"old_log_probs": actor.compute_log_probs(batch)}) if plan.old_log_probs == "pass" else RLBatch()

    def frozen_passes(self, plan) -> list[tuple[str, Callable[[RLBatch], RLBatch]]]:
        """Step 6's passes of frozen policies, (column, pass: batch -> its columns): the reference's (KL terms) and
        the teacher's (on-policy distillation; with plan.teacher_top_k its top-k tokens too, for GKD), each where
        the plan runs it."""
        ref, teacher, k = self.workers.reference, self.workers.teacher, plan.teacher_top_k
        passes = [("ref_log_probs", plan.reference, lambda b: RLBatch({"ref_log_probs": ref.compute_log_probs(b)})),
                  ("teacher_log_probs", plan.teacher, lambda b: RLBatch(
                      {"teacher_log_probs": teacher.compute_log_probs(b)} if not k else
                      dict(zip(("teacher_log_probs", "teacher_topk_ids", "teacher_topk_log_probs"),
                               teacher.compute_log_probs_and_top_k(b, k)))))]
        return [(column, frozen_pass) for column, on, frozen_pass in passes if on]

    def generate(self, batch: RLBatch, gen_round: int = 0) -> RLBatch:
        """Responses for every row. Under torchrun each rank samples its share of the rows and every
        rank gets all of them back (dist.shard_rollout), so the steps after the rollout see the whole batch;
        a step's later generation rounds (algorithm.filter_groups) fork their own seeds."""
        params = self.sampling()
        seed = (self.config.trainer.seed, self.step, *((gen_round,) if gen_round else ()))
        return check_rollout_columns(shard_rollout(lambda rows: self.rollout.generate(rows, params), batch,
                                                   row_seeds=not params.greedy, pad_token_id=self.tokenizer.pad_token_id,
                                                   seed=seed), self.config.rollout.name)

    def sampling(self) -> SamplingParams:
        """How the training rollout samples (rollout.*; validation's are rollout.val_*: validation.py)."""
        r = self.config.rollout
        return SamplingParams(max_new_tokens=r.max_new_tokens, top_p=r.top_p, top_k=r.top_k, temperature=r.temperature)

    def score(self, batch: RLBatch) -> tuple[RLBatch, dict[str, float]]:
        """response_text, score (B,) and token_level_scores (B, R), each score on its row's last response
        token (and the overlong penalty): `RewardScorer.score_batch` (reward/scoring.py)."""
        return self.reward.score_batch(batch, self.tokenizer, self.step)

    def correct_rollout(self, batch: RLBatch) -> tuple[RLBatch, dict[str, float]]:
        """Step 6b (algorithm.rollout_correction on): rollout_is_weights (B, R) and a loss_mask without the
        rejected tokens, from pi_old's log-probs against the engine's; the is_/rs_ rollout_corr/ metrics."""
        rc = compute_rollout_correction(batch["old_log_probs"], batch["rollout_log_probs"], batch["loss_mask"],
                                        **attrs.asdict(self.config.algorithm.rollout_correction), diagnostics=False)
        weights = {} if rc.weights is None else {"rollout_is_weights": rc.weights}
        return RLBatch({"loss_mask": rc.mask, **weights}), {k: float(v) for k, v in rc.metrics.items()}

    def rollout_mismatch(self, batch: RLBatch) -> dict[str, float]:
        """The rollout_corr/ diagnostics of the engine's log-probs against pi_old's (old_log_probs: the pass's
        or the on-policy update's) over the tokens stage 4b counts, rejected ones included."""
        counted = derive_loss_mask(batch, self.config.algorithm.mask_truncated)
        metrics = rollout_mismatch_metrics(batch["old_log_probs"], batch["rollout_log_probs"], counted)
        return {k: float(v) for k, v in metrics.items()}

    def compute_advantages(self, batch: RLBatch) -> tuple[RLBatch, dict[str, float]]:
        """token_level_rewards (scores minus the in-reward KL, if on), advantages and returns (B, R)."""
        alg, metrics = self.config.algorithm, {}
        rewards = batch["token_level_scores"]
        if alg.use_kl_in_reward:
            rewards, metrics = apply_kl_penalty(rewards, batch["old_log_probs"], batch["ref_log_probs"],
                                                batch["loss_mask"], self.kl_ctrl, alg.kl_penalty)
        if "ref_log_probs" in batch:
            kl = kl_penalty(batch["old_log_probs"], batch["ref_log_probs"], "k1")
            metrics["actor/ref_kl"] = float(masked_mean(kl, batch["loss_mask"]))
        if "teacher_log_probs" in batch:                  # KL(pi || teacher) per token, the distillation signal
            kl = kl_penalty(batch["old_log_probs"], batch["teacher_log_probs"], "k1")
            metrics["teacher/reverse_kl"] = float(masked_mean(kl, batch["loss_mask"]))
        if "teacher_topk_log_probs" in batch:             # how much of the teacher's distribution its top-k holds
            mass = batch["teacher_topk_log_probs"].exp().sum(-1)
            metrics["teacher/topk_mass"] = float(masked_mean(mass, batch["loss_mask"]))
        with_rewards = RLBatch({**batch.tensors, "token_level_rewards": rewards}, batch.non_tensors)
        advantages, returns = self.estimator(with_rewards, alg)
        metrics["advantages/mean"] = float(masked_mean(advantages, batch["loss_mask"]))
        return RLBatch({"token_level_rewards": rewards, "advantages": advantages, "returns": returns}), metrics

    def update_actor(self, batch: RLBatch, plan) -> tuple[RLBatch, dict[str, float]]:
        """Step 9: the actor's update and its metrics; an on-policy update whose log-probs the mismatch
        metrics read (plan.old_log_probs "from_update") returns them as old_log_probs (pi_old, no pass)."""
        actor = self.workers.actor
        if plan.old_log_probs == "from_update":
            metrics, old_log_probs = actor.on_policy_update(batch, self.policy_loss)
            return RLBatch({"old_log_probs": old_log_probs}), metrics
        return RLBatch(), actor.update(batch, self.policy_loss, on_policy=plan.on_policy)

    # ---- validation ----------------------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        """The val/ metrics of the policy at this step; its samples go to the trackers."""
        metrics, samples = validate(self.config, self.rollout, self.tokenizer, self.reward, self.val_data, self.step)
        self._tracker_call("log_samples", "val", samples, self.step)
        return metrics

    def eval_table(self, when: str) -> None:
        """trainer.eval_before_after: the eval table "before" the first step or "after" the last (eval.json)."""
        eval_before_after(self.config, self.rollout, self.tokenizer, self.reward, self.val_data, self.run_dir,
                          self.step, when)

    # ---- outputs -------------------------------------------------------------------------------------
    def _tracker_call(self, method: str, *args) -> dict[str, Any]:
        """{tracker: what its method returned}. Trackers never kill training: a failure is a warning (and
        no entry), metrics.jsonl stays the record."""
        out = {}
        for name, tracker in self.trackers.items():
            try:
                out[name] = getattr(tracker, method)(*args)
            except Exception as exc:
                print(f"warning: tracker {name}: {method} failed ({type(exc).__name__}: {exc})", file=sys.stderr)
        return out

    def write_rollouts(self, batch: RLBatch) -> None:
        k = self.config.trainer.rollout_samples
        if not k or not is_rank0():
            return
        rows = [{"uid": batch["uid"][i], "prompt": batch["prompt_text"][i], "response": batch["response_text"][i],
                 "score": float(batch["score"][i]),
                 "advantage": float(masked_mean(batch["advantages"][i], batch["loss_mask"][i])),
                 **({"episode": batch["episode"][i]} if is_episodes(batch) else {})}
                for i in range(len(batch) if k < 0 else min(k, len(batch)))]
        out = self.run_dir / "rollouts"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"step_{self.step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        self._tracker_call("log_samples", "rollouts", rows, self.step)

    def save(self) -> Path:
        state = {"step": self.step, "sampler": self.sampler.state_dict(), "kl_ctrl": self.kl_ctrl.state_dict(),
                 "trackers": self._tracker_call("state_dict")}
        return save_checkpoint(checkpoint_root(self.run_dir), self.step, self.workers, state,
                               self.config.trainer.keep_checkpoints)


def added(batch: RLBatch, stage_output: tuple[RLBatch, dict[str, float]]) -> dict[str, float]:
    """A stage's (columns, metrics): the columns go into `batch`, the metrics are returned."""
    columns, metrics = stage_output
    batch.update(columns)
    return metrics
