"""nanoverl's HF GRPO step against a bare hand-written loop doing the same compute, in one process.

    .venv/bin/python benchmarks/vs_bare.py                  # tiny and 10m, one JSON object per model
    .venv/bin/python benchmarks/vs_bare.py --models 10m --steps 10

The bare loop is what a researcher would write with no framework at all, calling the same
functions nanoverl calls on the same model files and prompts (pre-tokenised once, as nanoverl does
at load time):

    generate     model.generate(prompts repeated n times) with the same generation config and, on
                 CPU, the same sampling processor as the `hf` rollout (nanoverl_hf.rollout)
    reward       decode the responses (one batch_decode), the core's char_match per row
    advantages   GRPO: (score - group mean) / (group std + eps)
    loss         one forward over prompt + response with logits_to_keep, a batched
                 log_softmax-gather, the PPO ratio against the detached log-probs, token-mean
    update       backward, clip_grad_norm_(1.0), AdamW step, zero_grad

Both contenders run interleaved step by step (nanoverl, bare, nanoverl, ...) so machine load hits
both alike; the figure is the median over `--steps` steps after `--warmup`, and the overhead ratio
is nanoverl / bare (1.0 = no overhead).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (MODELS, TINY_DATA, build_model, machine, median, nanoverl_config, nanoverl_step,  # noqa: E402
                    nanoverl_trainer, now, num_parameters, peak_rss_mb, since, summary, tmpdir, workload)


class BareGRPO:
    """The minimal loop: the same calls as one nanoverl GRPO step, nothing else."""

    def __init__(self, model_dir: Path, batch: int, n: int, max_new_tokens: int, lr: float, seed: int = 0):
        import torch
        from nanoverl_hf.rollout import InverseCDFSampler
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LogitsProcessorList

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.config.use_cache = False
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.rows = [json.loads(line) for line in TINY_DATA.read_text().splitlines()]
        self.ids = [self.tok.encode(r["prompt"]) for r in self.rows]
        self.batch, self.n, self.max_new_tokens = batch, n, max_new_tokens
        self.gen = torch.Generator().manual_seed(seed)
        # temperature 1, no top-p / top-k, drawn as the hf rollout draws on CPU (argmax over the sampler's scores)
        self.gen_config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                           use_cache=True, eos_token_id=[self.tok.eos_token_id],
                                           pad_token_id=self.tok.pad_token_id)
        self.processors = LogitsProcessorList([InverseCDFSampler()])

    def step(self) -> None:
        torch, tok = self.torch, self.tok
        from nanoverl_core.builtins.rewards import char_match

        picks = torch.randint(len(self.rows), (self.batch,), generator=self.gen).tolist()
        prompts = [self.ids[i] for i in picks for _ in range(self.n)]
        width = max(map(len, prompts))
        ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

        # generate
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=self.gen_config,
                                      logits_processor=self.processors)
        self.model.train()
        resp = out[:, width:]                                                      # (B, R)
        is_eos = resp == tok.eos_token_id
        lengths = torch.where(is_eos.any(-1), is_eos.int().argmax(-1) + 1, resp.shape[1])
        rmask = (torch.arange(resp.shape[1]) < lengths[:, None]).float()           # up to and including EOS

        # reward and GRPO advantages
        texts = tok.batch_decode([r[:k] for r, k in zip(resp.tolist(), lengths.tolist())], skip_special_tokens=True)
        scores = torch.tensor([char_match("", t, self.rows[picks[i // self.n]]) for i, t in enumerate(texts)])
        groups = scores.view(self.batch, self.n)
        adv = ((groups - groups.mean(-1, keepdim=True)) / (groups.std(-1, keepdim=True) + 1e-6)).view(-1, 1)

        # loss: one forward, log-probs of the response tokens, PPO ratio vs detached, token-mean
        full = torch.cat([ids, resp], 1)
        attn = torch.cat([mask, rmask.long()], 1)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        R = resp.shape[1]
        logits = self.model(input_ids=full, attention_mask=attn, position_ids=pos, logits_to_keep=R + 1).logits
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, resp[..., None])[..., 0]   # (B, R)
        ratio = torch.exp(logp - logp.detach())
        loss = (-(adv * ratio) * rmask).sum() / rmask.sum()

        # update
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def run(model_name: str, args) -> dict:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    work = tmpdir(f"vs-bare-{model_name}")
    model_dir = build_model(model_name, work / "model")
    w = workload(model_name, args)
    nv = nanoverl_trainer(nanoverl_config(model_dir, work / "nanoverl", batch=w["batch"], n=w["n"],
                                          max_new_tokens=w["max_new_tokens"], lr=args.lr))
    bare = BareGRPO(model_dir, w["batch"], w["n"], w["max_new_tokens"], args.lr)

    nv_times, bare_times, nv_rows = [], [], []   # (wall, cpu) seconds per step
    for _ in range(args.warmup + args.steps):
        start = now()
        nv_rows.append(nanoverl_step(nv))
        nv_times.append(since(start))
        start = now()
        bare.step()
        bare_times.append(since(start))
    return {
        "benchmark": "vs_bare", "model": model_name, "parameters": num_parameters(model_dir),
        "batch_prompts": w["batch"], "n": w["n"], "max_new_tokens": w["max_new_tokens"],
        "steps_measured": args.steps, "warmup": args.warmup,
        **summary(nv_times, bare_times, args.warmup, ("nanoverl", "bare")),
        "nanoverl_timing_median": {k.removeprefix("timing/"): round(median([r[k] for r in nv_rows[args.warmup:]]), 4)
                                   for k in nv_rows[-1] if k.startswith("timing/")},
        "nanoverl_response_length_mean": round(median([r["rollout/response_length/mean"] for r in nv_rows]), 2),
        "bare_wall_s_all": [round(t[0], 3) for t in bare_times],
        "nanoverl_wall_s_all": [round(t[0], 3) for t in nv_times],
        "peak_rss_mb_both": round(peak_rss_mb(), 1), "machine": machine(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "10m"], choices=list(MODELS))
    parser.add_argument("--steps", type=int, default=None,
                        help="measured steps per contender (default 30 for tiny, 8 for the others)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=None, help="prompts per step (default: common.WORKLOADS)")
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--lr", type=float, default=1e-6)
    args = parser.parse_args(argv)
    steps = args.steps
    for name in args.models:
        args.steps = steps or (30 if name == "tiny" else 8)
        print(json.dumps(run(name, args)), flush=True)


if __name__ == "__main__":
    main()
