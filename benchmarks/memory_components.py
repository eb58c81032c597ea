"""Where a recipe's memory goes: the resident memory of each part of a run, for any config.

    .venv-vllm/bin/python benchmarks/memory_components.py --config examples/configs/smollm2_calculator.toml
    .venv/bin/python benchmarks/memory_components.py --config examples/configs/tiny_grpo.toml --steps 2
    .venv/bin/python benchmarks/memory_components.py --config examples/configs/smollm2_arithmetic.toml

The config's Trainer is built in this process exactly as `nanoverl-train` builds it (its run directory in a
temporary folder; no evaluation, validation or checkpoints) and runs `--steps` steps. Each stage of the
build is wrapped to read this process's resident memory (RSS, /proc/self/statm) before and after it; the
steps report their own peaks (`perf/peak_rss_mib`, `perf/children_peak_rss_mib`). Printed, one JSON object
(MiB):

  libraries          RSS after importing torch, transformers and the plugins, before anything is built
  workers            what building the workers added: the policy (and the reference, the teacher, the critic) with their
                     weights; `weights` splits it by model (bytes of each model's parameters and buffers)
  rollout            what building the rollout added: vLLM's engine in this process (its own copy of the
                     weights and its KV cache, `kv_cache` as the plugin sizes it), nothing much for `hf`
                     (it generates with the actor's module)
  data               what loading the validation and training rows added (tokenized prompts, and the
                     libraries a data source imports the first time)
  optimizer_state    bytes of the actor's and the critic's optimizer state after the first step (AdamW: two
                     tensors per trained one)
  first_step         what the first step left resident (the optimizer's state, allocator caches)
  step_peak          the highest step peak of this process, and `step_extra` = it less the RSS before that
                     step: activations, logits, the rollout's transient tensors
  phases             the highest peak of this process during each phase of the steps: `rollout` (generation,
                     the vLLM engine's KV cache filling), `update` (the actor's forward and backward: activations,
                     logits, gradients), `log_probs` (the actor's, the reference's and the teacher's no-grad passes, the critic's
                     value pass), `critic_update`, `weight_sync`; the step peak is the largest of them
  children_peak      the child processes' summed peak during the steps (reward and environment workers,
                     the code reward's sandboxes; started with the first step)
  total_peak         step_peak + children_peak: what the machine must hold at once, at most

The process's lifetime peak (`ru_maxrss`) is reported too: loading a model can peak above any step.
Every figure is this machine's (allocator, threads); the ISA and the library versions are printed with it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import isa, machine, recipe_overrides, tmpdir  # noqa: E402

MIB = 2**20


def tensor_mib(tensors) -> float:
    """Bytes of distinct tensor storages, in MiB (a tied embedding counted once)."""
    seen, total = set(), 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total / MIB


def module_mib(part) -> float | None:
    module = getattr(part, "module", None)
    if module is None:
        return None
    return round(tensor_mib([*module.parameters(), *module.buffers()]), 1)


def optimizer_mib(actor) -> float | None:
    optimizer = getattr(actor, "optimizer", None)
    if optimizer is None:
        return None
    import torch

    return round(tensor_mib([v for state in optimizer.state.values() for v in state.values()
                             if isinstance(v, torch.Tensor) and v.numel() > 1]), 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="config overrides (section.key=value)")
    args = parser.parse_args()

    from nanoverl_core import load_config, load_registry
    from nanoverl_core.processes import peak_resident_mib, resident_mib, step_peaks_mib
    from nanoverl_core.trainer import trainer as trainer_module

    registry = load_registry()
    out = tmpdir("memory")
    config = load_config(str(args.config), [*args.overrides, *recipe_overrides(out / "run", args.steps, "[jsonl]")],
                         registry=registry)
    report: dict = {"config": str(args.config), "overrides": args.overrides, "steps": args.steps,
                    "libraries": round(resident_mib(), 1)}

    def measured(name: str, fn):
        def wrapper(*a, **k):
            before = resident_mib()
            result = fn(*a, **k)
            report[name] = round(report.get(name, 0.0) + resident_mib() - before, 1)
            return result
        return wrapper

    trainer_module.build_workers = measured("workers", trainer_module.build_workers)
    trainer_module.build_rollout = measured("rollout", trainer_module.build_rollout)
    trainer_module.load_split = measured("data", trainer_module.load_split)
    trainer_module.PromptLoader = measured("data", trainer_module.PromptLoader)
    trainer = trainer_module.Trainer(config, registry)
    workers = trainer.workers
    report["weights"] = {part: module_mib(getattr(workers, part)) for part in ("actor", "reference", "critic", "teacher")
                         if getattr(workers, part, None) is not None}
    rollout = getattr(trainer.rollout, "engine", trainer.rollout)     # a multi-turn rollout's engine
    if getattr(rollout, "llm", None) is not None:           # the vllm rollout: its KV cache as the plugin sizes it
        from nanoverl_vllm.engine import engine_kwargs
        kv = engine_kwargs(config, rollout.folder, rollout.hf_config, load_format="dummy", sleep=False)
        report["kv_cache"] = round(kv.get("kv_cache_memory_bytes", 0) / MIB, 1) or "VLLM_CPU_KVCACHE_SPACE"
    report["built"] = round(resident_mib(), 1)

    phases: dict[str, float] = {}
    carried: list[float] = []                               # this step's peaks, as the wrappers reset them

    def phase(name: str, fn):
        """Wrap fn so that the peak RSS during each call is kept under `name` (and the step's own peak goes on)."""
        def wrapper(*a, **k):
            between = peak_resident_mib()                   # the peak so far in this step: handed to the step below
            try:
                return fn(*a, **k)
            finally:
                during = peak_resident_mib()
                phases[name] = round(max(phases.get(name, 0.0), during), 1)
                carried.append(max(between or 0.0, during or 0.0))
        return wrapper

    trainer.rollout.generate = phase("rollout", trainer.rollout.generate)
    trainer.rollout.sync_weights = phase("weight_sync", trainer.rollout.sync_weights)
    for part, methods in (("actor", ("update", "compute_log_probs")), ("reference", ("compute_log_probs",)),
                          ("teacher", ("compute_log_probs",)), ("critic", ("update", "compute_values"))):
        worker = getattr(workers, part, None)
        for method in methods if worker is not None else ():
            name = "update" if (part, method) == ("actor", "update") else \
                "critic_update" if method == "update" else "log_probs"
            setattr(worker, method, phase(name, getattr(worker, method)))
    step_peaks_mib()                                        # the first step's peaks start here
    peaks, extras, children = [], [], []
    for step in range(args.steps):
        before = resident_mib()
        trainer.step += 1
        carried.clear()
        metrics = trainer.train_step()
        peaks.append(max([metrics["perf/peak_rss_mib"], *carried]))
        extras.append(peaks[-1] - before)
        children.append(metrics["perf/children_peak_rss_mib"])
        if step == 0:
            report["first_step"] = round(resident_mib() - before, 1)
            report["optimizer_state"] = {part: optimizer_mib(getattr(workers, part)) for part in ("actor", "critic")
                                         if getattr(workers, part) is not None}
    trainer.rollout.close()
    trainer.reward.close()
    report.update(step_peak=round(max(peaks), 1), step_extra=round(max(extras), 1), phases=phases,
                  children_peak=round(max(children), 1), total_peak=round(max(p + c for p, c in zip(peaks, children)), 1),
                  ru_maxrss=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  isa=isa(), **machine())
    print(json.dumps(report))
    os._exit(0)                                             # an in-process engine's threads do not hold the exit


if __name__ == "__main__":
    sys.exit(main())
