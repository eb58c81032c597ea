"""Contract checks for backend authors: call them from your plugin's tests.

    from nanoverl_core.testing import check_actor, check_rollout, check_same_run, prompt_batch
    from nanoverl_core.testing import assert_same_adam_step        # two updates that should agree
    from nanoverl_core.testing import with_loss_mask               # a hand-built batch's loss_mask
    from nanoverl_core.testing import assert_user_error            # the CLI's error contract
    from nanoverl_core.testing import score_texts                  # a reward's scores of plain texts

    batch = prompt_batch(workers.tokenizer, ["12=", "345="], n=2)
    batch.update(check_rollout(rollout, batch, max_new_tokens=4))    # returns one sampled output
    check_actor(workers.actor, batch)                                 # runs one real update
    check_actor(workers.reference, batch, update=False)               # a frozen actor

Each check raises AssertionError naming the rule a backend broke. The rules are those of
`nanoverl_core.protocols` and of the hook docs in `nanoverl_core.hookspecs` (rows in order, seeds
from torch's global generator, greedy calls draw nothing, full tensors for the weight sync).
The core's tests run them on the debug backends, each first-party plugin's tests on its own.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from .algos.losses import vanilla
from .batch import RLBatch, derive_loss_mask
from .protocols import Actor, PolicyLoss, Rollout
from .reward.texts import ByteTokenizer, as_responses  # noqa: F401 (ByteTokenizer: a public name here)
from .rollout import SamplingParams

MACHINE_METRICS = ("timing/", "throughput/", "perf/")
"""Prefixes of the metrics that measure the machine (seconds, tokens/s, resident memory): they differ
between any two runs, so comparisons of runs leave them out."""


def without_machine_metrics(row: dict) -> dict:
    """A metrics.jsonl row without the keys under MACHINE_METRICS."""
    return {k: v for k, v in row.items() if not k.startswith(MACHINE_METRICS)}


def prompt_batch(tokenizer, texts: list[str], n: int = 1) -> RLBatch:
    """Left-padded `prompts` / `prompt_mask` (B, P) for `texts`, each repeated n times (one uid per text)."""
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    width = max(len(x) for x in ids)
    prompts = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, tokens in enumerate(ids):
        prompts[row, width - len(tokens):] = torch.tensor(tokens, dtype=torch.long)
        mask[row, width - len(tokens):] = 1
    batch = RLBatch({"prompts": prompts, "prompt_mask": mask}, {"uid": [f"p{i}" for i in range(len(ids))]})
    return batch.repeat_interleave(n)


def with_loss_mask(batch: RLBatch, mask_truncated: bool = False) -> RLBatch:
    """`batch` (edited in place) with the loss_mask the trainer gives an update: every token the model
    sampled (an episode's model_mask, else response_mask), and with `mask_truncated` none of a truncated
    row's. It calls the trainer's own derivation (`batch.derive_loss_mask`), so a test that builds its
    batch by hand cannot drift from a run."""
    batch["loss_mask"] = derive_loss_mask(batch, mask_truncated)
    return batch


def score_texts(scorer, batch: RLBatch, texts: list[str], *, phase: str = "train",
                step: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Scores (B,) and metrics of `texts` as the responses to `batch`'s rows (which hold what a reward reads:
    prompt_text, row, index and data_source), through the one entry point the trainer scores with,
    `RewardScorer.score_batch` (the texts as `ByteTokenizer` responses: `nanoverl_core.reward.as_responses`)."""
    scored, metrics = scorer.score_batch(as_responses(batch, texts), ByteTokenizer(), step, phase=phase)
    return scored["score"], metrics


def _check_outputs(out: RLBatch, rows: int, max_new_tokens: int) -> None:
    responses, mask = out["responses"], out["response_mask"]
    assert len(out) == rows, f"generate returned {len(out)} rows for {rows}: one response per row, in order"
    assert responses.dtype == torch.long and responses.dim() == 2, "responses must be (B, R) int64"
    assert mask.shape == responses.shape and mask.dtype.is_floating_point, \
        "response_mask must be a float tensor with the shape of responses"
    assert responses.shape[1] <= max_new_tokens, f"responses are wider than max_new_tokens={max_new_tokens}"
    lengths = mask.sum(-1).long()
    prefix = (torch.arange(mask.shape[1]) < lengths[:, None]).to(mask.dtype)
    assert torch.equal(mask, prefix), "response_mask must be 1 on a prefix of each row (right padding)"
    if "rollout_log_probs" in out:
        lp = out["rollout_log_probs"]
        assert lp.shape == responses.shape, "rollout_log_probs must be (B, R) like responses"
        assert torch.all(lp * (1 - mask) == 0), "rollout_log_probs must be 0 on padding"
        assert torch.all(lp <= 1e-4), "rollout_log_probs are log-probabilities: at most 0"
    truncated = out["truncated"] if "truncated" in out else None
    assert truncated is not None and truncated.dtype == torch.bool and truncated.shape == (rows,), \
        "generate must return truncated, (B,) bool: True for a row that ended without a stop token"
    assert torch.all(lengths[~truncated] > 0), "a row that is not truncated must end with its stop token"
    assert "loss_mask" not in out, "generate must not return loss_mask (the trainer derives it); a rollout whose " \
        "responses hold tokens the model did not sample reports its own as model_mask (nanoverl_core.batch)"
    if "model_mask" in out:
        assert out["model_mask"].shape == responses.shape and torch.all(out["model_mask"] * (1 - mask) == 0), \
            "model_mask must be (B, R) like responses and 0 on padding"


def _rows(out: RLBatch) -> list[tuple[list[int], int, bool]]:
    """(response tokens, valid length, truncated) of each row."""
    return list(zip(out["responses"].tolist(), out["response_mask"].sum(-1).long().tolist(), out["truncated"].tolist()))


def _check_stop_tokens(outputs: list[RLBatch]) -> None:
    """What can be checked of `truncated` without knowing the engine's stop ids: the token that ends a
    row that is not truncated is a stop id, and a response ends at its first stop token, so a stop id
    may stand nowhere else (not inside a row, not in a truncated row) in any output of the engine."""
    stops = {tokens[n - 1] for out in outputs for tokens, n, cut in _rows(out) if not cut}
    for out in outputs:
        for row, (tokens, n, cut) in enumerate(_rows(out)):
            found = stops & set(tokens[:n] if cut else tokens[:n - 1])
            assert not found, f"row {row} holds {sorted(found)} {'although truncated' if cut else 'before its end'}, " \
                "a token that ends a row that is not truncated: a response ends at its first stop token, and " \
                "truncated is True exactly for the rows without one"


def check_rollout(rollout: Rollout, batch: RLBatch, max_new_tokens: int = 4) -> RLBatch:
    """A rollout's contract on `batch` (prompts, prompt_mask, uid); returns one sampled output.

    Shapes, dtypes and masks of generate's output (responses, response_mask, truncated, optionally
    rollout_log_probs); the same seed of torch's global generator gives the same samples; a greedy call
    draws nothing from it; greedy rows do not depend on the other rows or their order; `truncated`
    agrees with the stop tokens the outputs show (`_check_stop_tokens`); close() exists.
    """
    assert isinstance(rollout, Rollout), f"{type(rollout).__name__} lacks generate / sync_weights / close"
    sampled = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
    greedy = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    torch.manual_seed(1234)
    first = rollout.generate(batch, sampled)
    _check_outputs(first, len(batch), max_new_tokens)
    assert ("rollout_log_probs" in first) == bool(rollout.returns_log_probs), \
        "rollout_log_probs must be returned exactly when returns_log_probs is true"
    torch.manual_seed(1234)
    again = rollout.generate(batch, sampled)
    assert torch.equal(first["responses"], again["responses"]), \
        "sampling must be seeded from torch's global generator: the same seed must give the same responses"
    assert torch.equal(first["truncated"], again["truncated"]), "the same responses must have the same truncated"
    state = torch.get_rng_state()
    plain = rollout.generate(batch, greedy)
    assert torch.equal(state, torch.get_rng_state()), "a greedy generate must not draw from torch's global generator"
    _check_outputs(plain, len(batch), max_new_tokens)
    order = list(reversed(range(len(batch))))
    flipped = rollout.generate(batch.index(order), greedy)
    _check_outputs(flipped, len(batch), max_new_tokens)
    for row, source in enumerate(order):
        n = int(plain["response_mask"][source].sum())
        assert torch.equal(flipped["responses"][row, :n], plain["responses"][source, :n]) \
            and flipped["truncated"][row] == plain["truncated"][source], \
            "greedy responses must follow their own prompt whatever the row order"
    _check_stop_tokens([first, plain, flipped])
    return first


def check_actor(actor: Actor, batch: RLBatch, *, update: bool = True,
                policy_loss: PolicyLoss = vanilla) -> dict[str, float] | None:
    """An actor's contract on a batch with responses (prompts, prompt_mask, responses, response_mask);
    returns the update's metrics, or None with update=False (a frozen reference: nothing is trained).

    Log-probs (B, R) on the CPU, no grad, finite, at most 0, 0 on padding, stable across calls;
    full_tensors covers the state dict at full size (a LoRA actor, `actor.lora`: the merged model's
    entries, unsharded, leaving the module's weights unchanged). Then one real update, called as the
    trainer calls it (`_check_update`).
    """
    assert isinstance(actor, Actor), f"{type(actor).__name__} lacks module / device / compute_log_probs / " \
                                     "update / full_tensors / save / load"
    mask = batch["response_mask"]
    log_probs = actor.compute_log_probs(batch)
    assert log_probs.shape == mask.shape and log_probs.device.type == "cpu", "log-probs must be (B, R) on the CPU"
    assert not log_probs.requires_grad, "compute_log_probs must not build a graph"
    assert torch.isfinite(log_probs).all() and torch.all(log_probs <= 1e-4), "log-probs must be finite and <= 0"
    assert torch.all(log_probs * (1 - mask) == 0), "log-probs must be 0 on padding"
    torch.testing.assert_close(actor.compute_log_probs(batch), log_probs, msg="log-probs must not change between calls")
    _check_full_tensors(actor)
    if not update:
        return None
    metrics = _check_update(actor, batch, log_probs, policy_loss)
    if hasattr(actor, "on_policy_update"):
        _check_on_policy_update(actor, batch, policy_loss)
    return metrics


def _check_on_policy_update(actor: Actor, batch: RLBatch, policy_loss: PolicyLoss) -> None:
    """`on_policy_update` (the Actor protocol's optional method) returns, with its metrics, what
    `compute_log_probs` gives just before it, every row (every rank's), in order. On-policy means one optimizer
    step: the rows of one mini-batch (a TorchActor's `actor.mini_batch_size` prompts x rollout.n), and nothing
    to check for an actor configured with more than one PPO epoch."""
    from .workers import TorchActor

    if isinstance(actor, TorchActor):
        if actor.section.ppo_epochs != 1:
            return
        if actor.mini_batch_prompts:
            batch = batch.index(slice(0, actor.mini_batch_prompts * actor.config.rollout.n))
    before = actor.compute_log_probs(batch)
    train = batch.index(slice(None))
    train["advantages"] = batch["response_mask"].float().clone()
    with_loss_mask(train)
    metrics, kept = actor.on_policy_update(train, policy_loss)
    assert isinstance(metrics, dict) and all(isinstance(v, float) for v in metrics.values()), \
        "on_policy_update must return the update's metrics (name -> float) first"
    assert torch.is_tensor(kept) and kept.shape == before.shape and not kept.requires_grad and \
        kept.device.type == "cpu", "on_policy_update must return its forward's (B, R) log-probs, detached, on the CPU"
    torch.testing.assert_close(kept, before, rtol=1e-5, atol=1e-5,
                               msg="on_policy_update's log-probs must equal compute_log_probs before it (pi_old)")


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A state-dict entry at full size (a sharded DTensor gathered)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _check_full_tensors(actor: Actor) -> None:
    if getattr(actor, "lora", False):   # a LoRA actor yields the merged model's entries, not its wrapper's
        before = {k: _full(v).clone() for k, v in actor.module.state_dict().items()}
        merged = [(name, tensor.clone()) for name, tensor in actor.full_tensors()]
        assert merged and all(not hasattr(t, "full_tensor") for _, t in merged), "full_tensors must be unsharded"
        after = {k: _full(v) for k, v in actor.module.state_dict().items()}
        assert all(torch.equal(before[k], after[k]) for k in before), "full_tensors must not change the weights"
        return
    names = [name for name, _ in actor.full_tensors()]
    state = actor.module.state_dict()
    assert names == list(state), "full_tensors must yield every state-dict entry, in state-dict order"
    for name, tensor in actor.full_tensors():
        assert tensor.shape == _full(state[name]).shape and not hasattr(tensor, "full_tensor"), \
            f"{name}: full_tensors must be unsharded"


def _check_update(actor: Actor, batch: RLBatch, log_probs: torch.Tensor,
                  policy_loss: PolicyLoss) -> dict[str, float]:
    """`actor.update(batch, policy_loss, on_policy=False)` on a copy of `batch` with old_log_probs and
    ref_log_probs = the actor's log-probs and advantages +1 on every valid token: it returns finite float
    metrics, changes the weights full_tensors yields (what a rollout loads), and raises the mean log-prob
    of the responses (the loss is minimised), still 0 on padding."""
    mask = batch["response_mask"]
    assert mask.sum() > 0, "check_actor's update needs a batch with at least one response token"
    train = batch.index(slice(None))                # a copy: the caller's batch keeps its columns
    train["old_log_probs"], train["ref_log_probs"] = log_probs.clone(), log_probs.clone()
    train["advantages"] = mask.float().clone()      # +1 on every valid token
    with_loss_mask(train)                           # every sampled token counts
    before = {name: tensor.clone() for name, tensor in actor.full_tensors()}
    metrics = actor.update(train, policy_loss, on_policy=False)
    assert isinstance(metrics, dict) and metrics, "update must return its metrics, a dict of name -> float"
    bad = {key: value for key, value in metrics.items()
           if not (isinstance(key, str) and isinstance(value, float) and math.isfinite(value))}
    assert not bad, f"update's metrics must be finite floats under string keys: {bad}"
    assert any(not torch.equal(before[name], tensor) for name, tensor in actor.full_tensors()), \
        "update must change the weights (full_tensors after it must differ)"
    after = actor.compute_log_probs(batch)
    assert torch.all(after * (1 - mask) == 0), "log-probs must be 0 on padding after an update"
    rise = float(((after - log_probs) * mask).sum() / mask.sum())
    assert rise > 0, f"an update with advantages +1 must raise the responses' mean log-prob (it moved by {rise:.3g}): " \
                     "is the loss minimised?"
    return metrics


def assert_same_adam_step(got: dict, want: dict, grads_got: dict, grads_want: dict, *, grad_rtol: float = 1e-5,
                          grad_atol: float = 1e-6, atol: float = 1e-6, clear: float = 1e-6,
                          min_compared: float = 0.9) -> None:
    """Two updates of the same start that should agree (two code paths, or two backends): the optimizer's
    inputs (`grads_*`, name -> gradient as the optimizer saw it) to grad_rtol / grad_atol everywhere, and
    its outputs (`got` / `want`, name -> parameter after the step) to `atol` wherever the step is well
    conditioned.

    Adam's first step is lr * g / (|g| + eps): its derivative lr * eps / (|g| + eps)^2 is ~1/eps times
    larger at |g| ~ eps (1e-8) than at |g| = 1e-6, so float rounding of a near-zero gradient (summation
    order, thread count, CPU) legitimately moves that parameter by up to ~lr. Those elements are left out
    of the parameter comparison: compared are the elements whose gradient is above `clear` (1e-6, where a
    1e-5 relative rounding moves the step by at most ~1e-10 * lr / 1e-6) and those whose two gradients are
    bitwise equal (the same input gives the same step). At least `min_compared` of all elements must be
    compared, so the check cannot pass by comparing nothing."""
    assert got.keys() == want.keys(), f"parameters differ: {sorted(got.keys() ^ want.keys())}"
    assert grads_got.keys() == grads_want.keys(), f"gradients differ: {sorted(grads_got.keys() ^ grads_want.keys())}"
    compared = total = 0
    for name in want:
        if name not in grads_want:
            torch.testing.assert_close(got[name], want[name], rtol=0, atol=atol, msg=lambda m, name=name: f"{name}: {m}")
            compared, total = compared + want[name].numel(), total + want[name].numel()
            continue
        g_got, g_want = grads_got[name], grads_want[name]
        torch.testing.assert_close(g_got, g_want, rtol=grad_rtol, atol=grad_atol,
                                   msg=lambda m, name=name: f"{name} gradient: {m}")
        clean = (g_want.abs() > clear) | (g_got == g_want)
        torch.testing.assert_close(got[name][clean], want[name][clean], rtol=0, atol=atol,
                                   msg=lambda m, name=name: f"{name}: {m}")
        compared, total = compared + int(clean.sum()), total + clean.numel()
    assert total and compared / total >= min_compared, \
        f"only {compared} of {total} parameter elements have a well-conditioned step: compare a larger update"


def check_same_run(reference: Path, other: Path, *, atol: float = 1e-5, rtol: float = 1e-5) -> int:
    """Two run directories of one config on different backends or rank counts (one process and 2
    torchrun ranks, say) logged the same run: the same steps, every step's metrics within atol + rtol
    (MACHINE_METRICS aside; a step logged twice, before a kill and after the resume, counts
    its last line), and the same (prompt, response) rows in rollouts/. Returns the values compared."""
    def steps(run: Path) -> dict[int, dict]:
        return {row["step"]: row for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}

    def rows(run: Path, step: int) -> list[tuple[str, str]]:
        lines = (run / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
        return [(row["prompt"], row["response"]) for row in map(json.loads, lines)]

    def compared_keys(row: dict) -> set[str]:
        return {k for k in row if k != "step" and not k.startswith(MACHINE_METRICS)}

    want, got = steps(reference), steps(other)
    assert sorted(want) == sorted(got), f"steps {sorted(want)} vs {sorted(got)}"
    compared = 0
    for step, metrics in want.items():
        keys = compared_keys(metrics)
        assert keys == compared_keys(got[step]), f"step {step}: keys {sorted(keys ^ compared_keys(got[step]))}"
        for key in keys:
            assert math.isclose(got[step][key], metrics[key], abs_tol=atol, rel_tol=rtol), \
                f"step {step} {key}: {got[step][key]} vs {metrics[key]}"
            compared += 1
        if (reference / "rollouts" / f"step_{step}.jsonl").is_file():
            assert rows(other, step) == rows(reference, step), f"step {step}: different samples"
    return compared


def assert_user_error(proc, *needles: str) -> str:
    """A finished `nanoverl-train` process (subprocess.run's result) kept the error contract: exit 2,
    exactly one stderr line starting with `error:` holding every needle, no traceback. Returns that line."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
