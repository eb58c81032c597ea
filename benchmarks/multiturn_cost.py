"""The cost of turns: one episode of 3 model turns against one single-turn response with as many generated tokens.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/multiturn_cost.py                        # hf rollout, 10m model
    HF_HUB_OFFLINE=1 .venv-vllm/bin/python benchmarks/multiturn_cost.py --rollouts hf vllm
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/multiturn_cost.py --model tiny --rows 4 --turn-tokens 4 --reps 1
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/multiturn_cost.py --set rollout.hf.turn_cache=false

One JSON line per rollout. Both contenders sample `--rows` rows at temperature 1 with the same rollout
and weights: "single" asks for `3 x --turn-tokens` new tokens at once; "episodes" runs
nanoverl_core.env.EpisodeRollout with 3 turns of `--turn-tokens` (environment.max_turn_tokens), the
environment answering each of the first two turns with a short text ("=7"). The model (`10m` of
benchmarks/common.py, a 4,014-character vocabulary) almost never samples EOS, so both generate the same
number of model tokens (reported: model_tokens). Rounds alternate between the two (`--reps` each,
after one warm-up each); reported are the median wall times and `ratio` = episodes / single.
`--set section.key=value` adds config overrides (reported: set).

What it measures: the rollout's extra work per turn. Each turn is one generate call, so the
conversation so far is a new prompt: the `hf` rollout keeps each episode's KV cache from the turn
before and prefills only the new tokens (`[rollout.hf] turn_cache = false`: it prefills the whole
context again, one batched forward over it), vLLM finds the prefix in its prefix cache. Plus three
calls' fixed costs instead of one; decode steps, one forward per token, are most of the time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from common import build_model, machine, median, tmpdir  # noqa: E402


class Answers:
    def step(self, turn):
        from nanoverl_core.env import EnvStep
        return EnvStep(observation="=7")


def contenders(name: str, model: Path, tmp: Path, args):
    """(single-turn rollout, episode rollout, batch, single params, episode params) for rollout `name`."""
    import torch

    from nanoverl_core import RLBatch, SamplingParams, load_config, load_registry
    from nanoverl_core.env import EpisodeRollout, InProcess
    from nanoverl_hf.workers import make_workers

    data = tmp / "data.jsonl"
    data.write_text('{"prompt": "12=", "target": "12"}\n')
    total = 3 * args.turn_tokens + 2 * 2                                  # 3 turns and two "=7" answers
    cfg = load_config(None, [f"data.train_files=[{data}]", f"model.path={model}", "worker.name=hf",
                             f"rollout.name={name}", "trainer.device=cpu", "data.batch_size=1",
                             f"rollout.max_new_tokens={total}", "data.max_prompt_length=32", "environment.max_turns=3",
                             f"environment.max_turn_tokens={args.turn_tokens}", *args.set], registry=load_registry())
    workers = make_workers(cfg)
    if name == "vllm":
        from nanoverl_vllm.rollout import VLLMRollout
        engine = VLLMRollout(cfg, workers)
    else:
        from nanoverl_hf.rollout import HFRollout
        engine = HFRollout(cfg, workers)
    episodes = EpisodeRollout(engine, InProcess(lambda row: Answers(), None, 0), cfg, workers.tokenizer, name="answers")
    tok = workers.tokenizer
    ids = [tok.encode(f"{i:04d}=") for i in range(args.rows)]
    prompts = torch.tensor(ids)
    batch = RLBatch({"prompts": prompts, "prompt_mask": torch.ones_like(prompts)},
                    {"index": list(range(args.rows)), "row": [{}] * args.rows})
    return (engine, episodes, batch, SamplingParams(max_new_tokens=3 * args.turn_tokens, temperature=1.0),
            SamplingParams(max_new_tokens=total, temperature=1.0))


def measure(name: str, model: Path, tmp: Path, args) -> dict:
    import torch

    engine, episodes, batch, single_params, episode_params = contenders(name, model, tmp, args)
    times: dict[str, list[float]] = {"single": [], "episodes": []}
    tokens: dict[str, int] = {}
    try:
        for rep in range(args.reps + 1):                                   # round 0 warms both up
            for kind in ("single", "episodes"):
                torch.manual_seed(rep)
                start = time.perf_counter()
                out = engine.generate(batch, single_params) if kind == "single" else \
                    episodes.generate(batch, episode_params)
                elapsed = time.perf_counter() - start
                mask = out["model_mask"] if "model_mask" in out else out["response_mask"]   # the model's tokens
                tokens[kind] = int(mask.sum())
                if rep:
                    times[kind].append(elapsed)
    finally:
        engine.close()
    single, multi = median(times["single"]), median(times["episodes"])
    return {"benchmark": "multiturn_cost", "rollout": name, "rows": args.rows, "turn_tokens": args.turn_tokens,
            "set": args.set, "model_tokens": tokens, "single_s": round(single, 4), "episodes_s": round(multi, 4),
            "ratio": round(multi / single, 3), "single_s_all": [round(t, 4) for t in times["single"]],
            "episodes_s_all": [round(t, 4) for t in times["episodes"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", nargs="+", default=["hf"], choices=["hf", "vllm"])
    parser.add_argument("--model", default="10m", choices=["tiny", "10m"])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--turn-tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--set", nargs="*", default=[], metavar="section.key=value", help="more config overrides")
    args = parser.parse_args()
    tmp = tmpdir("nanoverl-bench-multiturn-")
    model = build_model(args.model, tmp / args.model)          # tiny: hf only (vLLM's CPU attention needs head_dim 32)
    for name in args.rollouts:
        print(json.dumps({**measure(name, model, tmp, args), "model": args.model, "machine": machine()}), flush=True)


if __name__ == "__main__":
    main()
