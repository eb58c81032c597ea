"""model.compile: torch.compile over the cache-free parts of each transformer block, against eager PyTorch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from nanoverl_core.algos import logprobs_from_hidden
from nanoverl_core.errors import ConfigError

from test_mixed_precision import _config, _passes, _workers

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++")),
                                reason="torch.compile's CPU kernels need a C++ compiler")


@pytest.mark.hf
def test_compiled_passes_equal_eager_ones_and_keep_the_checkpoints_names(tmp_path):
    """Same seed, same weights: the compiled actor, reference and critic give the eager log-probs and values
    to float rounding (measured max |diff| 4.8e-7 and 6.7e-8 on this tiny Llama; bounds 1e-5), one update
    of each moves every weight alike (6.6e-6 measured; bound 5e-5), and the module's state_dict is the
    eager one's, name for name (a checkpoint does not change). Compiled: the norms and MLP of every
    block, never its attention (which writes the KV cache of its layer)."""
    eager, compiled = (_workers(tmp_path, f"model.compile={flag}", "actor.logits_chunk_size=3")
                       for flag in ("false", "true"))
    parts = {name.rsplit(".", 1)[-1] for name, m in compiled.actor.module.named_modules()
             if getattr(m, "_compiled_call_impl", None) is not None}
    assert parts == {"input_layernorm", "post_attention_layernorm", "mlp"}
    b_eager, before_eager, after_eager = _passes(eager)
    b_compiled, before_compiled, after_compiled = _passes(compiled)
    assert all(torch.equal(before_eager[n], before_compiled[n]) for n in before_eager)
    mask = b_eager["response_mask"] == 1
    for key in ("old_log_probs", "ref_log_probs", "values"):
        torch.testing.assert_close(b_compiled[key][mask], b_eager[key][mask], rtol=0, atol=1e-5)
    moved = max((after_eager[n] - before_eager[n]).abs().max() for n in after_eager)
    assert moved > 1e-4                                   # the update did move the weights
    for name in after_eager:
        torch.testing.assert_close(after_compiled[name], after_eager[name], rtol=0, atol=5e-5)
    assert list(compiled.actor.module.state_dict()) == list(eager.actor.module.state_dict())


@pytest.mark.hf
def test_new_batch_shapes_compile_no_new_graphs(tmp_path):
    """Dynamic shapes: after the first passes (log-prob, reference, value, both updates; packed rows, and
    shared prompts with their one-time check), batches of other row counts, prompt lengths and response
    widths run on the graphs already compiled. (A size of exactly 1, one distinct prompt in a micro-batch or
    a packed micro-batch's one sequence, compiles its own graph once: torch's 0/1 specialization.)"""
    from nanoverl_core.algos import vanilla
    from nanoverl_core.testing import prompt_batch, with_loss_mask
    from nanoverl_core.workers import compile_metrics

    workers = _workers(tmp_path, "model.compile=true")
    _passes(workers)
    graphs = None
    g = torch.Generator().manual_seed(1)
    first = [(["12=", "3=", "4444=", "55=", "6="], 7), (["abcdefgh=", "7="] * 3, 2)]      # packed, then shared
    for i, (prompts, width) in enumerate([*first, (["1=", "22=", "333=", "4444=", "55555=", "6="], 9),
                                          (["abcdefg=", "8="] * 4, 3)]):
        batch = prompt_batch(workers.tokenizer, prompts)
        rows = len(prompts)
        batch["responses"] = torch.randint(3, 40, (rows, width), generator=g)
        lengths = torch.randint(1, width + 1, (rows, 1), generator=g)
        batch["response_mask"] = (torch.arange(width)[None] < lengths).float()
        batch["advantages"] = batch["returns"] = torch.randn(rows, width, generator=g) * batch["response_mask"]
        with_loss_mask(batch)
        batch["old_log_probs"] = workers.actor.compute_log_probs(batch)
        batch["ref_log_probs"] = workers.reference.compute_log_probs(batch)
        batch["values"] = workers.critic.compute_values(batch)
        workers.actor.update(batch, vanilla)
        workers.critic.update(batch)
        if i == len(first) - 1:
            graphs = compile_metrics()["perf/compiled_graphs"]
    assert compile_metrics()["perf/compiled_graphs"] == graphs


@pytest.mark.hf
def test_a_compiled_run_logs_its_graphs_and_compile_seconds(tmp_path):
    """Through the trainer (hf rollout sharing the actor's module: its decode steps run the compiled MLPs too):
    every step's metrics carry perf/compiled_graphs and perf/compile_s, and no graph is compiled after step 1."""
    from nanoverl_core import load_config, load_registry
    from nanoverl_core.trainer.trainer import Trainer

    pytest.importorskip("nanoverl_hf")
    tiny = ROOT / "examples" / "tiny_task" / "model"
    data = ROOT / "examples" / "data" / "tiny_copy" / "train.jsonl"
    config = load_config(ROOT / "examples" / "configs" / "tiny_grpo.toml",
                         [f"model.path={tiny}", f"data.train_files=[{data}]", "data.val_files=[]", "data.batch_size=4",
                          "rollout.n=4", "model.compile=true", "trainer.total_steps=3", "trainer.val_every=0",
                          "trainer.save_every=0", "trainer.eval_before_after=false", "trainer.progress=none",
                          f"trainer.output_dir={tmp_path / 'run'}", "tracking.trackers=[jsonl]"],
                         registry=load_registry())
    Trainer(config, load_registry()).fit()
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    graphs = [s["perf/compiled_graphs"] for s in steps if "perf/compiled_graphs" in s]
    assert len(graphs) == 3 and graphs[0] > 0 and graphs[-1] == graphs[0], graphs
    assert all(s["perf/compile_s"] > 0 for s in steps if "perf/compile_s" in s)


@pytest.mark.hf
def test_a_model_without_blocks_or_a_cpu_without_a_compiler_is_a_config_error(tmp_path, monkeypatch):
    from nanoverl_core.builtins.debug import make_workers
    from nanoverl_core.workers import compile as compile_module

    with pytest.raises(ConfigError, match="model.compile = true, but TinyCausalLM names no transformer blocks"):
        make_workers(_config(tmp_path, "model.compile=true", "trainer.device=cpu"))
    monkeypatch.setattr(compile_module.shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="model.compile = true needs a C.. compiler on CPU"):
        _workers(tmp_path, "model.compile=true")


@pytest.mark.parametrize("chunk", [5, 12], ids=["recomputed_chunks", "one_kept_chunk"])
@pytest.mark.parametrize("temperature, with_entropy", [(1.0, True), (0.7, False)])
def test_the_compiled_head_gives_the_eager_log_probs_entropy_and_gradients(chunk, temperature, with_entropy):
    """The chunked LM head's arithmetic after each product, compiled (one fused pass per chunk) against the
    eager in-place kernels: log-probs, entropy and the gradients of hidden, weight and bias to float rounding
    (atol 1e-5), whether backward recomputes each chunk's logits or reuses the forward's one chunk."""
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(12, 16, generator=g), torch.randn(40, 16, generator=g) / 4
    bias = torch.randn(40, generator=g)
    labels, coeffs = torch.randint(0, 40, (12,), generator=g), torch.randn(12, generator=g)

    def run(compiled: bool):
        h, w, b = (x.clone().requires_grad_() for x in (hidden, weight, bias))
        log_probs, entropy = logprobs_from_hidden(h, w, labels, b, temperature=temperature, with_entropy=with_entropy,
                                                  chunk_size=chunk, compiled=compiled)
        ((log_probs * coeffs).sum() + (entropy.sum() if with_entropy else 0)).backward()
        return log_probs, entropy, h.grad, w.grad, b.grad

    eager, compiled = run(False), run(True)
    assert (eager[1] is None) == (not with_entropy) == (compiled[1] is None)
    for want, got in zip(eager, compiled):
        if want is not None:
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
