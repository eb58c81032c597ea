"""One PPO update of policy and critic on a fixed batch, with the hf or the fsdp worker.

    python update_driver.py --worker hf --model DIR --out results.pt
    torchrun --standalone --nproc_per_node=2 update_driver.py --worker fsdp --model DIR --out results.pt --ckpt DIR

The batch, the config and the initial weights depend only on the seed, so every process (and every
world size) starts from the same numbers. Rank 0 writes the results: log-probs, values, the update
metrics, each optimizer step's gradients and parameters (`steps`, see record_steps) and the full
parameters after the update. With --ckpt the fsdp actor also saves a sharded checkpoint there and the
results hold the FSDP policy's logits on a fixed input (for the export test).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from nanoverl_core import RLBatch, load_config, load_registry
from nanoverl_core.algos import vanilla
from nanoverl_core.dist import close_distributed

ROWS_PER_PROMPT = 4
OVERRIDES = [
    "rollout.name=hf", "trainer.device=cpu", "trainer.seed=0", "data.batch_size=4", f"rollout.n={ROWS_PER_PROMPT}",
    "rollout.max_new_tokens=6", "rollout.temperature=0.9",
    # two optimizer steps per epoch (mini-batches of 2 prompts = 8 rows), micro-batches of 2 rows,
    # two epochs, a clip that binds: every piece of the core's update loop is exercised
    "actor.mini_batch_size=2", "actor.micro_batch_size=2", "actor.ppo_epochs=2", "actor.lr=1e-2",
    "actor.grad_clip=0.3", "actor.entropy_coeff=0.01", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.1",
    "actor.lr_schedule=cosine", "actor.warmup_steps=1", "actor.weight_decay=0.01",
    "reference.enable=true", "critic.enable=true", "critic.lr=1e-2", "critic.mini_batch_size=2",
    "critic.micro_batch_size=2", "critic.grad_clip=0.3", "algorithm.advantage_estimator=gae",
]


PLAIN_PASSES = ("actor.share_prompts=false", "critic.share_prompts=false")
"""The hf side runs every row whole; the fsdp side shares prompts (packed, as the tiny sdpa Llama is by default:
each distinct prompt once in a micro-batch's line, in every pass), so its shared passes are checked against
plain ones."""


def make_config(worker: str, model: Path, extra: tuple[str, ...] = ()):
    plain = PLAIN_PASSES if worker == "hf" else ()
    return load_config(None, [f"worker.name={worker}", f"model.path={model}", f"data.train_files=[{model}/unused.jsonl]",
                              *OVERRIDES, *plain, *extra], registry=load_registry())


def fixed_batch(tokenizer, prompts: int = 4, seed: int = 1) -> RLBatch:
    """prompts x ROWS_PER_PROMPT rows: left-padded digit prompts, right-padded responses of 1-6 tokens
    (some ending in EOS), and random advantages, returns and old log-probs offsets."""
    g = torch.Generator().manual_seed(seed)
    rows = prompts * ROWS_PER_PROMPT
    digits = [tokenizer.convert_tokens_to_ids(c) for c in "0123456789"]
    P, R = 6, 6
    batch = RLBatch({"prompts": torch.full((rows, P), tokenizer.pad_token_id), "prompt_mask": torch.zeros(rows, P, dtype=torch.long),
                     "responses": torch.full((rows, R), tokenizer.pad_token_id), "response_mask": torch.zeros(rows, R)},
                    {"uid": [f"p{i // ROWS_PER_PROMPT}" for i in range(rows)]})
    for i in range(rows):
        p = int(torch.randint(2, P + 1, (1,), generator=g))
        prompt = [digits[int(j)] for j in torch.randint(0, 10, (p,), generator=g)]
        batch["prompts"][i, P - p:] = torch.tensor(prompt)
        batch["prompt_mask"][i, P - p:] = 1
        r = int(torch.randint(1, R + 1, (1,), generator=g))
        response = [digits[int(j)] for j in torch.randint(0, 10, (r,), generator=g)]
        if torch.rand((), generator=g) < 0.5:
            response[-1] = tokenizer.eos_token_id
        batch["responses"][i, :r] = torch.tensor(response)
        batch["response_mask"][i, :r] = 1
    mask = batch["response_mask"]
    batch["advantages"] = torch.randn(rows, R, generator=g) * mask
    from nanoverl_core.testing import with_loss_mask
    with_loss_mask(batch)                                          # every sampled token counts
    batch["returns"] = torch.randn(rows, R, generator=g) * mask
    batch["old_log_probs_offset"] = 0.3 * torch.randn(rows, R, generator=g) * mask   # ratios away from 1: clipping
    return batch


def full_params(worker) -> dict[str, torch.Tensor]:
    """Every full tensor on the CPU (a collective under torchrun: every rank calls it)."""
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().clone()
            for k, v in worker.module.state_dict().items()}


def record_steps(worker, steps: list, replay: list | None = None) -> None:
    """Append each optimizer step of `worker` to `steps`: {"grads": the gradients as the optimizer sees
    them (after the clip), "params": the trainable parameters after the step}, full tensors (a collective
    under FSDP, which every rank's step runs). With `replay` (another run's `steps`), each step then
    continues from that run's parameters, so every step of the two runs starts from the same weights and
    they compare step by step: otherwise Adam, which moves a weight by ~lr whatever the size of its
    gradient, turns float rounding on near-zero gradients into parameter differences of ~lr that the
    later steps carry on (more or less with the CPU and the thread count)."""
    names = {p: name for name, p in worker.module.named_parameters() if p.requires_grad}

    def full(t: torch.Tensor) -> torch.Tensor:
        return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu().clone()

    def before(optimizer, args, kwargs):
        steps.append({"grads": {names[p]: full(p.grad) for group in optimizer.param_groups for p in group["params"]
                                if p.grad is not None}})

    def after(optimizer, args, kwargs):
        steps[-1]["params"] = {name: full(p) for p, name in names.items()}
        if replay is not None:
            with torch.no_grad():
                for p, name in names.items():
                    p.copy_(replay[len(steps) - 1]["params"][name])

    worker.optimizer.register_step_pre_hook(before)
    worker.optimizer.register_step_post_hook(after)


def run(worker: str, model: Path, ckpt: Path | None = None, extra: tuple[str, ...] = (),
        replay: dict | None = None) -> dict:
    """The update on `worker`; `replay` (another run's results, hf side only) continues each optimizer step
    from that run's parameters (record_steps)."""
    if worker == "hf":
        from nanoverl_hf.workers import make_workers
    else:
        from nanoverl_fsdp.workers import make_workers
    config = make_config(worker, model, extra)
    torch.manual_seed(0)
    workers = make_workers(config)
    batch = fixed_batch(workers.tokenizer)
    out: dict = {"initial": full_params(workers.actor), "steps": {"actor": [], "critic": []}}
    out["packing"] = [workers.actor.forward_pass.packing,        # packed micro-batches, or None
                      workers.critic.forward_pass.packing]
    for name in ("actor", "critic"):
        record_steps(getattr(workers, name), out["steps"][name], replay and replay["steps"][name])
    log_probs = workers.actor.compute_log_probs(batch)                              # (16, 6)
    batch["old_log_probs"] = log_probs + batch.pop("old_log_probs_offset")
    batch["ref_log_probs"] = workers.reference.compute_log_probs(batch)
    batch["values"] = workers.critic.compute_values(batch)
    out.update(log_probs=log_probs, ref_log_probs=batch["ref_log_probs"], values=batch["values"])
    out["critic_metrics"] = workers.critic.update(batch)
    out["actor_metrics"] = workers.actor.update(batch, vanilla)
    # 7 rows: 4 + 3 across two ranks, so the second rank pads its share with a masked fill row
    odd = batch.index(list(range(7)))
    out["odd_log_probs"] = workers.actor.compute_log_probs(odd)
    out["odd_actor_metrics"] = workers.actor.update(odd, vanilla)
    out["actor"], out["critic"] = full_params(workers.actor), full_params(workers.critic)
    if ckpt is not None:
        workers.actor.save(ckpt / "actor")
        ids = batch["prompts"][:3]
        with torch.no_grad():
            out["logits"] = workers.actor.module(input_ids=ids).logits.float()      # every rank: a collective
        out["logits_input"] = ids
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=["hf", "fsdp"], required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ckpt", type=Path)
    parser.add_argument("overrides", nargs="*", help="config overrides after OVERRIDES")
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        out = run(args.worker, args.model, args.ckpt, tuple(args.overrides))
        if int(os.environ.get("RANK", "0")) == 0:
            torch.save(out, args.out)
    finally:
        close_distributed()  # a process group left alive at exit can abort in gloo's threads


if __name__ == "__main__":
    main()
    # The results are written. Leave without running interpreter and C++ teardown: gloo's worker
    # threads can still abort the process there ("terminate called without an active exception",
    # seen intermittently on CI even after destroy_process_group), failing a run that succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
