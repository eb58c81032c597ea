"""The endpoint's cost: the same episodes through agents on the OpenAI client against the built-in episode loop.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/agents_overhead.py                       # hf rollout, 10m model
    HF_HUB_OFFLINE=1 .venv-vllm/bin/python benchmarks/agents_overhead.py --rollouts hf vllm
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/agents_overhead.py --rows 4 --turn-tokens 4 --reps 1

One JSON line per rollout. Both contenders run `--rows` episodes of 3 model turns of `--turn-tokens` tokens
at temperature 1 on the same engine and weights, each turn answered by a `tool` message ("7") rendered
through the chat template:

* "episodes": nanoverl_core.env.EpisodeRollout with an environment that answers every turn;
* "agents": nanoverl_core.agents.AgentRollout with an agent function, run in 2 agent worker processes,
  that asks the question with `client.chat.completions.create`, appends the reply and the tool message,
  and asks again: each call crosses HTTP to the endpoint, is rendered, queued and batched onto the engine.

The model (`10m` of benchmarks/common.py, its vocabulary widened with printable ASCII for the template)
almost never samples EOS, so both generate the same tokens: with the same seed the agents' rows are the
episodes' rows token for token (reported: identical), since both render the same conversation and
sample each turn as one batched engine call. Rounds alternate between the two (`--reps` each, after one
warm-up each); reported are the median wall times of a batch and `ratio` = agents / episodes. A step
goes on from the rollout with the same work for both: `step_ratio` times each rollout followed by the rest
of a PPO step on what it returned (the old-log-prob pass and one update of the actor over the rows, with
advantages drawn from the seed and the learning rate 0, so both contenders keep sampling from the same
weights), the step a training run takes with these episodes, less its reward calls.
"""

from __future__ import annotations

import argparse
import json
import os
import string
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from common import MODELS, machine, median, tmpdir  # noqa: E402

CHATML = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>\n{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
AGENT = """
    def agent(row, client):
        messages = [{"role": "user", "content": row["q"]}]
        for turn in range(3):
            reply = client.chat.completions.create(model="m", messages=messages, max_tokens=row["tokens"])
            messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "content": "7"}]
"""


class Answers:
    def step(self, turn):
        from nanoverl_core.env import EnvStep
        return EnvStep(observation=[{"role": "tool", "content": "7"}])


def build(out: Path) -> Path:
    import torch
    from nanoverl_hf.tiny import build_tiny_model
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = MODELS["10m"]
    alphabet = string.printable.replace("\x0b", "").replace("\x0c", "") + spec["alphabet"]
    build_tiny_model(out, alphabet=alphabet, hidden=spec["hidden"], layers=spec["layers"], heads=spec["heads"],
                     intermediate=spec["intermediate"], max_positions=1024, chat_template=CHATML)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out)).save_pretrained(out)
    return out


def contenders(name: str, model: Path, tmp: Path, args):
    import torch

    from nanoverl_core import RLBatch, SamplingParams, load_config, load_registry
    from nanoverl_core.agents import AgentRollout, AgentSource
    from nanoverl_core.env import EpisodeRollout, InProcess
    from nanoverl_hf.workers import make_workers

    data, agent = tmp / "data.jsonl", tmp / "agent.py"
    data.write_text('{"prompt": "12=", "target": "12"}\n')
    agent.write_text(textwrap.dedent(AGENT))
    total = 3 * args.turn_tokens + 2 * 32                                  # 3 turns and two answers, with room
    cfg = load_config(None, [f"data.train_files=[{data}]", f"model.path={model}", "worker.name=hf",
                             f"rollout.name={name}", "trainer.device=cpu", f"data.batch_size={args.rows}",
                             f"rollout.max_new_tokens={total}", "environment.max_turns=3",
                             f"environment.max_turn_tokens={args.turn_tokens}", "agent.workers=2",
                             f"actor.micro_batch_size={args.rows}", "actor.lr=0"],
                      registry=load_registry())
    workers = make_workers(cfg)
    if name == "vllm":
        from nanoverl_vllm.rollout import VLLMRollout
        engine = VLLMRollout(cfg, workers)
    else:
        from nanoverl_hf.rollout import HFRollout
        engine = HFRollout(cfg, workers)
    tok = workers.tokenizer
    episodes = EpisodeRollout(engine, InProcess(lambda row: Answers(), None, 0), cfg, tok, name="answers")
    agents = AgentRollout(engine, AgentSource(file=str(agent), function="agent"), cfg, tok)
    questions = [f"{i:04d}=" for i in range(args.rows)]
    ids = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
           for q in questions]
    ids = [tok.encode(text, add_special_tokens=False) for text in ids]
    prompts = torch.tensor(ids)
    batch = RLBatch({"prompts": prompts, "prompt_mask": torch.ones_like(prompts)},
                    {"index": list(range(args.rows)), "row": [{"q": q, "tokens": args.turn_tokens} for q in questions]})
    return workers.actor, {"episodes": episodes, "agents": agents}, batch, SamplingParams(max_new_tokens=total,
                                                                                        temperature=1.0)


def rest_of_step(actor, batch, out) -> None:
    """The old-log-prob pass and one update (lr 0) on the rollout's rows, as a step runs them."""
    import torch

    from nanoverl_core.algos import vanilla
    from nanoverl_core.batch import derive_loss_mask

    rows = batch.index(slice(None))
    rows.update(out)
    rows["loss_mask"] = derive_loss_mask(rows, False)
    rows["advantages"] = torch.randn(rows["loss_mask"].shape) * rows["loss_mask"]
    rows["old_log_probs"] = actor.compute_log_probs(rows)
    actor.update(rows, vanilla)


def measure(name: str, model: Path, tmp: Path, args) -> dict:
    import torch

    actor, rollouts, batch, params = contenders(name, model, tmp, args)
    times: dict[str, list[float]] = {"episodes": [], "agents": []}
    steps: dict[str, list[float]] = {"episodes": [], "agents": []}
    tokens, identical = {}, []
    try:
        for rep in range(args.reps + 1):                                   # round 0 warms both up
            outs = {}
            for kind, rollout in rollouts.items():
                torch.manual_seed(rep)
                start = time.perf_counter()
                outs[kind] = rollout.generate(batch, params)
                elapsed = time.perf_counter() - start
                rest_of_step(actor, batch, outs[kind])
                step = time.perf_counter() - start
                tokens[kind] = int(outs[kind]["model_mask"].sum())
                if rep:
                    times[kind].append(elapsed)
                    steps[kind].append(step)
            identical.append(bool(torch.equal(outs["episodes"]["responses"], outs["agents"]["responses"])
                                  and torch.equal(outs["episodes"]["model_mask"], outs["agents"]["model_mask"])))
    finally:
        rollouts["agents"].close()                                         # its endpoint, its workers, the engine
    base, agents = median(times["episodes"]), median(times["agents"])
    return {"benchmark": "agents_overhead", "rollout": name, "rows": args.rows, "turn_tokens": args.turn_tokens,
            "model_tokens": tokens, "identical": all(identical), "episodes_s": round(base, 4),
            "agents_s": round(agents, 4), "ratio": round(agents / base, 3),
            "episodes_step_s": round(median(steps["episodes"]), 4), "agents_step_s": round(median(steps["agents"]), 4),
            "step_ratio": round(median(steps["agents"]) / median(steps["episodes"]), 3),
            "episodes_s_all": [round(t, 4) for t in times["episodes"]],
            "agents_s_all": [round(t, 4) for t in times["agents"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", nargs="+", default=["hf"], choices=["hf", "vllm"])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--turn-tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    tmp = tmpdir("nanoverl-bench-agents-")
    model = build(tmp / "10m")
    for name in args.rollouts:
        print(json.dumps({**measure(name, model, tmp, args), "model": "10m", "machine": machine()}), flush=True)


if __name__ == "__main__":
    main()
