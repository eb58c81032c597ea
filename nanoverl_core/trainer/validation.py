"""Validation: sample every validation prompt (greedy or n samples), score, summarise per data source.

`evaluate` is the pure part (a rollout, a reward, the data): the trainer's `validate` and the
`nanoverl-train eval` command both call it. `eval_decodings` is the eval table (greedy, and sampled
mean@n): `nanoverl-train eval` prints it, and `trainer.eval_before_after` writes it before the first
and after the last step into the run's eval.json.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..batch import is_episodes
from ..data import collate
from ..env import episode_metrics
from ..rollout import SamplingParams, check_rollout_columns, rollout_rows
from ..dist import fork_rng, is_rank0


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator (Chen et al. 2021, HumanEval): the chance that at least one of k
    samples drawn without replacement from n, of which c passed, passes: 1 - C(n - c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_ks(n: int) -> list[int]:
    """The k logged for n samples per prompt: 1, 2, 4, ... up to n, and n."""
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return ks + ([n] if ks[-1] != n else [])


@torch.no_grad()
def evaluate(config, rollout, tokenizer, scorer, data, params: SamplingParams, n: int,
             seed: int, step: int | None = None, keep: int = 16,
             progress: Callable[[int], None] | None = None) -> tuple[dict[str, float], list[dict]]:
    """mean@n, best@n, pass@k and per-data-source means of `scorer` over every prompt of `data`, n samples each.

    Returns ({"reward/mean", f"reward/best@{n}", f"reward/pass@{k}" for k in pass_ks(n) (a sample passes
    with a score >= reward.pass_threshold), "reward/errors", "reward/timeouts", "reward/crashes" (failed
    reward calls, summed), every extra key the rewards return as in training (reward/<key>, with components
    reward/<name>/<key> and reward/<name>/mean: the mean over the samples that returned it),
    "rollout/truncated_frac" (samples that ended without a stop token), "<source>/reward/mean" (when there
    are sources), and for multi-turn episodes the episode/... metrics of training (turns, tool calls, ...)
    over all samples}, the first `keep` sample rows: prompt, response, score, the rewards' extra keys
    ("extras") and a failed call's "error" (keep = -1: every sample, each also with its data row's index,
    data source and the row itself, what `nanoverl-train eval --samples` writes)). `progress(k)` is called
    after each batch of k prompts. Runs under a forked RNG seeded from `seed` (the CPU's and every CUDA
    device's), so it leaves the caller's random stream untouched."""
    by_source: dict[str, list[float]] = defaultdict(list)
    means, bests, samples, passed, truncated = [], [], [], [], 0
    failures, episodes = defaultdict(float), defaultdict(float)  # episodes: sums over samples (`_tally`)
    extras: dict[str, list[float]] = defaultdict(list)  # each extra key's values, over the samples that returned it
    with fork_rng():
        torch.manual_seed(seed)
        for start in range(0, len(data), config.data.val_batch_size):
            indices = list(range(start, min(start + config.data.val_batch_size, len(data))))
            batch = collate(data, indices, tokenizer.pad_token_id, config.data.data_source_key)
            batch["uid"] = [f"val-{i}" for i in indices]
            batch = batch.repeat_interleave(n)
            batch = rollout_rows(batch, check_rollout_columns(rollout.generate(batch, params), config.rollout.name),
                                 split_rows=False)
            scored, reward_metrics = scorer.score_batch(batch, tokenizer, step, phase="val")
            scores, texts, details = scored["score"], scored["response_text"], scored["reward_detail"]  # with env rewards
            truncated += _tally(batch, reward_metrics, details, failures, extras, episodes)
            per_prompt = scores.view(-1, n)  # (prompts, n)
            passed += (per_prompt >= config.reward.pass_threshold).sum(1).tolist()
            means += per_prompt.mean(1).tolist()
            bests += per_prompt.max(1).values.tolist()
            for source, score in zip(batch["data_source"], scores.tolist()):
                by_source[source].append(score)
            count = len(batch) if keep < 0 else min(keep - len(samples), len(batch))
            samples += _sample_rows(batch, texts, scores, details, count, every=keep < 0)
            if progress is not None:
                progress(len(indices))
    metrics = {"reward/mean": sum(means) / len(means), f"reward/best@{n}": sum(bests) / len(bests), **failures}
    metrics.update({key: sum(values) / len(values) for key, values in sorted(extras.items())})
    metrics["rollout/truncated_frac"] = truncated / (len(means) * n)
    metrics.update({key: value if key == "episode/errors" else value / len(means) / n for key, value in episodes.items()})
    metrics.update({f"reward/pass@{k}": sum(pass_at_k(n, c, k) for c in passed) / len(passed) for k in pass_ks(n)})
    if len(by_source) > 1 or "default" not in by_source:
        metrics.update({f"{src}/reward/mean": sum(v) / len(v) for src, v in sorted(by_source.items())})
    return metrics, samples


def _tally(batch, reward_metrics: dict[str, float], details: list[dict], failures: dict[str, float],
           extras: dict[str, list[float]], episodes: dict[str, float]) -> int:
    """Add a scored batch's failed calls to `failures`, its rewards' extra values to `extras` and its episode
    metrics (times the samples; episode/errors as is) to `episodes`; return its truncated samples."""
    for key in ("reward/errors", "reward/timeouts", "reward/crashes"):
        failures[key] += reward_metrics.get(key, 0.0)
    for detail in details:
        for key, value in detail.items():
            if key != "error":
                extras[key].append(value)
    if is_episodes(batch):
        for key, value in episode_metrics(batch).items():
            episodes[key] += value if key == "episode/errors" else value * len(batch)
    return int(batch["truncated"].sum())


def sample_detail(detail: dict) -> dict:
    """A sample row's share of a scorer's row detail: {"extras": {key: value}} when its rewards returned extra
    keys (under their metric names), {"error": <what went wrong>} when a call failed."""
    extras = {k: v for k, v in detail.items() if k != "error"}
    return ({"extras": extras} if extras else {}) | ({"error": detail["error"]} if "error" in detail else {})


def _sample_rows(batch, texts: list[str], scores: torch.Tensor, details: list[dict], count: int,
                 every: bool) -> list[dict]:
    """The first `count` scored samples as rows: prompt, response, score, the rewards' extras and a failed
    call's error (`sample_detail`), an episode's turns; `every` (eval --samples) adds each one's data row,
    its index and its data source."""
    return [{**({"index": batch["index"][i], "data_source": batch["data_source"][i]} if every else {}),
             "prompt": batch["prompt_text"][i], "response": texts[i], "score": float(scores[i]),
             **sample_detail(details[i]),
             **({"episode": batch["episode"][i]} if is_episodes(batch) else {}),
             **({"row": batch["row"][i]} if every else {})} for i in range(count)]


def validate(config, rollout, tokenizer, scorer, data, step: int) -> tuple[dict[str, float], list[dict]]:
    """val/reward/mean (mean@n), val/reward/best@n and val/<data_source>/reward/mean of the policy at `step`
    on `data`, sampled as rollout.val_* say; and the sample rows for the trackers (`Tracker.log_samples`)."""
    r = config.rollout
    n = r.val_n if r.val_temperature > 0 else 1     # greedy samples would all be the same
    params = SamplingParams(r.max_new_tokens, temperature=r.val_temperature, top_p=r.top_p, top_k=r.top_k)
    metrics, samples = evaluate(config, rollout, tokenizer, scorer, data, params, n, config.trainer.seed + step, step)
    return {f"val/{key}": value for key, value in metrics.items()}, samples


def eval_decodings(config, rollout, tokenizer, scorer, data, samples: list[dict] | None = None,
                   show_progress: bool = False) -> dict[str, dict[str, float]]:
    """{"greedy": metrics, "T=<temperature>": metrics}: greedy with one sample per prompt, and sampled at
    rollout.temperature / top_p / top_k with rollout.val_n samples per prompt; each metrics dict has "n".
    With a list `samples`, every scored sample is appended to it, with its "decoding" (evaluate's keep = -1).
    `show_progress`: the prompts done of each decoding on stderr (trainer.progress: a bar on a terminal,
    else a line per batch; "none": nothing)."""
    r = config.rollout
    runs = {"greedy": (SamplingParams(r.max_new_tokens, temperature=0.0), 1),
            f"T={r.temperature:g}": (SamplingParams(r.max_new_tokens, r.temperature, r.top_p, r.top_k), r.val_n)}
    results = {}
    for name, (params, n) in runs.items():
        progress = EvalProgress(config.trainer.progress, f"eval {name}", len(data)) if show_progress else None
        metrics, rows = evaluate(config, rollout, tokenizer, scorer, data, params, n, config.trainer.seed,
                                 keep=16 if samples is None else -1, progress=progress)
        results[name] = metrics | {"n": float(n)}
        if samples is not None:
            samples += [{"decoding": name, **row} for row in rows]
    return results


class EvalProgress:
    """`eval`'s progress on stderr: a bar redrawn in place on a terminal (trainer.progress "bar", or
    "auto" on a terminal), one line per batch otherwise ("log", or "auto" off a terminal), nothing for "none"."""

    def __init__(self, mode: str, label: str, total: int):
        self.label, self.total, self.done, self.start = label, total, 0, time.monotonic()
        self.bar = mode == "bar" or (mode == "auto" and sys.stderr.isatty())
        self.quiet = mode == "none"

    def __call__(self, prompts: int) -> None:
        self.done += prompts
        if self.quiet:
            return
        elapsed = time.monotonic() - self.start
        left = elapsed / self.done * (self.total - self.done)
        if self.bar:
            filled = int(30 * self.done / self.total)
            end = "\n" if self.done == self.total else "\x1b[K"
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} prompts "
                             f"left {left:.0f}s{end}")
        else:
            sys.stderr.write(f"{self.label}: {self.done}/{self.total} prompts, {elapsed:.0f}s, left {left:.0f}s\n")
        sys.stderr.flush()


def format_eval(report: dict[str, Any]) -> str:
    """An eval report ({"model", "checkpoint", "prompts", "results"}) as a table: one row per decoding,
    then per data source."""
    what = report["checkpoint"] or f"{report['model']} (base)"
    lines = [f"eval of {what} on {report['prompts']} validation prompts",
             f"{'decoding':<12} {'n':>3} {'mean@n':>8} {'best@n':>8}"]
    sources = []
    for name, m in report["results"].items():
        n = int(m["n"])
        lines.append(f"{name:<12} {n:>3} {m['reward/mean']:>8.4f} {m[f'reward/best@{n}']:>8.4f}")
        sources += [(name, key.removesuffix("/reward/mean"), v) for key, v in m.items()
                    if key.endswith("/reward/mean") and key != "reward/mean"]
    lines += [f"  {name:<10} {source}: {value:.4f}" for name, source, value in sources]
    lines += [f"  {name:<10} {key}: {value:.4f}" for name, m in report["results"].items()
              for key, value in m.items() if shown_in_table(key, value)]
    return "\n".join(lines)


COUNTS = ("reward/errors", "reward/timeouts", "reward/crashes", "episode/errors")


def shown_in_table(key: str, value: float) -> bool:
    """The metrics the eval table lists under its rows: the rewards' extra keys (reward/<key>, the code reward's
    compile_error, ...), rollout/truncated_frac, the episode counters' /mean and /rate, and failed calls when
    there were any; not the columns (mean@n, best@n), pass@k or the per-source means listed above them."""
    if key in COUNTS:
        return value > 0
    if key.startswith("reward/"):
        return key != "reward/mean" and not key.startswith(("reward/best@", "reward/pass@"))
    return key == "rollout/truncated_frac" or key.startswith("episode/") and key.endswith(("/mean", "/rate"))


def eval_before_after(config, rollout, tokenizer, scorer, data, run_dir: Path, step: int, when: str) -> None:
    """The eval table of the policy at `step` on `data`, printed (to stderr) and stored as eval.json[when] in
    `run_dir` ("before": the policy at step 0, kept across resumes; "after": at the last step)."""
    results = eval_decodings(config, rollout, tokenizer, scorer, data)
    if not is_rank0():
        return
    path = run_dir / "eval.json"
    stored = json.loads(path.read_text()) if path.is_file() else {}
    stored[when] = {"model": config.model.path or config.worker.name, "checkpoint": None if when == "before" else
                    f"step {step}", "step": step, "prompts": len(data), "results": results}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(stored, indent=2))
    tmp.replace(path)
    print(f"{when} training:\n{format_eval(stored[when])}", file=sys.stderr)
