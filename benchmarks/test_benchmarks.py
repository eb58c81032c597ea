"""The benchmark scripts run end to end on CPU and print the JSON they promise (a minute or two).

    .venv/bin/python -m pytest -q benchmarks/test_benchmarks.py

Timings are not asserted (they depend on the machine); shapes, keys and the memory figure are.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def run(script: str, *args: str) -> list[dict]:
    proc = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True,
                          timeout=600, cwd=HERE.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_gpu_check_smoke_runs_every_path_on_cpu():
    *paths, final = run("gpu_check.py", "--smoke")
    assert final["gpu_check"] == "ok" and final["full_shape_parameters"] == 494_032_768   # Qwen2.5-0.5B's shape
    assert [p["path"] for p in paths] == ["hf", "fsdp", "fsdp_vllm"]     # fsdp_vllm: skipped without vLLM
    for result in paths:
        if "skipped" in result:
            continue
        assert result["stages"]["rollout"]["tokens_per_s"] > 0 and "mfu" in result["stages"]["actor_update"]
        assert result["response_length_mean"] == 8.0                                # random policy: no early EOS


def test_packing_times_packed_against_padded_at_equal_results():
    (row,) = run("packing.py", "--model", "tiny", "--prompts", "2", "--n", "2", "--min-len", "2", "--max-len", "40",
                 "--repeats", "1", "--threads", "1")
    assert 0 < row["padding_fraction"] < 1 and row["real_tokens"] < row["padded_tokens"] and row["layout"] == "rows"
    assert row["max_log_prob_diff"] < 1e-5 and row["loss_rel_diff"] < 1e-5 and row["grad_norm_rel_diff"] < 1e-5
    assert set(row["update_s"]) == {"padded", "packed", "lines"} and row["update_speedup"] > 0
    assert row["lines_max_log_prob_diff"] < 1e-5 and row["update_lines_speedup"] > 0
    tokens = row["update_tokens"]            # packed: each of the 2 prompts once, no padding: fewest tokens
    assert tokens["packed"] < min(tokens["padded"], tokens["lines"]) and row["token_bound"] > 1
    assert row["isa"] and row["gemm_fp32_gflops"] > 0


def test_step_breakdown_runs_a_recipe_as_it_ships_with_overrides():
    (row,) = run("step_breakdown.py", "--config", "examples/configs/tiny_grpo.toml", "--steps", "1", "--warmup", "0",
                 "--set", "actor.pack=false")
    assert row["workload"] == "tiny_grpo" and row["model"] == "examples/tiny_task/model"
    assert row["actor_pack_layout"] == "none" and "actor.pack=false" in row["overrides"]
    assert row["batch_prompts"] * row["n"] == 16 * 16 and row["stage_s"]["actor_update"] > 0


def test_step_breakdown_reports_every_stage_of_ppo_with_critic_and_reference():
    (row,) = run("step_breakdown.py", "--workloads", "hf-tiny-ppo", "--no-sweep", "--steps", "1", "--warmup", "0")
    assert set(row["stage_s"]) >= {"rollout", "reward", "old_log_probs", "ref_log_probs", "values", "advantages",
                                   "critic_update", "actor_update", "weight_sync", "step"}
    assert row["generated_tokens_per_s"] > 0 and row["trained_tokens_per_s"] > 0 and row["peak_rss_mb"] > 0
    assert 0 < row["update_fraction_of_gemm"] < 1 and len(row["actor_update_s_all"]) == 1
    assert row["gemm_dtype"] == "float32"
    # 8 samples a prompt share it: the FLOPs run are fewer than the useful count, which assumes every row whole
    assert 0 < row["update_executed_fraction_of_gemm"] < row["update_fraction_of_gemm"]


def test_step_breakdown_set_overrides_every_workload():
    (row,) = run("step_breakdown.py", "--workloads", "hf-tiny", "--no-sweep", "--steps", "1", "--warmup", "0",
                 "--set", "actor.share_prompts=false")
    assert row["update_executed_fraction_of_gemm"] == row["update_fraction_of_gemm"]     # every row run whole


def test_step_breakdown_states_the_update_against_the_gemm_rate_of_its_own_precision():
    from nanoverl_core.workers.precision import cpu_has_fast

    if not cpu_has_fast("bfloat16"):           # its bf16 GEMM probe would take many minutes on an emulating CPU
        pytest.skip("this CPU has no bf16 matmul instructions")
    (row,) = run("step_breakdown.py", "--workloads", "hf-tiny", "--no-sweep", "--steps", "1", "--warmup", "0",
                 "--set", "model.compute_dtype=bfloat16")
    assert row["gemm_dtype"] == "bfloat16" and row["gemm_gflops_per_s"] > 0


def test_attention_probe_times_each_precision_forward_and_backward():
    (row,) = run("attention_probe.py", "--rows", "2", "--heads", "2", "--tokens", "16", "--threads", "1",
                 "--repeats", "1")
    assert row["shape"] == [2, 2, 16, 64] and row["isa"]
    assert set(row["results"]) == {"float32", "bfloat16", "bfloat16_attended_in_float32", "bfloat16_math_kernel"}
    assert all(r["forward_ms"] > 0 and r["forward_backward_ms"] > 0 for r in row["results"].values())


def test_gemm_probe_reports_the_square_and_the_model_shapes_in_each_dtype():
    from nanoverl_core.workers.precision import cpu_has_fast

    # a CPU without bf16 matmul instructions emulates them: its bf16 rows take over 8 minutes here
    dtypes = ["float32", "bfloat16"] if cpu_has_fast("bfloat16") else ["float32"]
    rows = run("gemm_probe.py", "--threads", "1", "--tokens", "64", "--repeats", "1", "--dtypes", *dtypes)
    assert [(row["threads"], row["dtype"]) for row in rows] == [(1, dtype) for dtype in dtypes]
    for row in rows:
        assert row["square_2048_gflops"] > 0
        assert set(row["shape_gflops"]) == {"q_o_proj", "k_v_proj", "mlp_up", "mlp_down", "mlp_up_weight_grad",
                                            "lm_head", "lm_head_input_grad"}
        # the update's products together, against the square product (the summary's ratio is of the unrounded
        # rates; the printed rates are rounded to 0.1 GFLOP/s)
        ratio = row["update_mix_gflops"] / row["square_2048_gflops"]
        assert 0 < row["summary"]["update_mix_over_square"] == pytest.approx(ratio, abs=0.1 / row["square_2048_gflops"]
                                                                              + 0.001)


def test_the_update_mix_weighs_each_product_by_its_flops():
    """Hand-computed: one product of 2 GFLOP at 100 GFLOP/s and three of 2 at 300 take 0.02 + 0.02 s: 200."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gemm_probe import update_mix, update_products

    assert update_mix({"a": 100.0, "b": 300.0}, {"a": ((1000, 1000, 1000), 1), "b": ((1000, 1000, 1000), 3)}) \
        == pytest.approx(200.0)
    products = update_products(586, 512)
    assert len(products) == 15 and products["q_o_weight_grad"] == ((576, 586, 576), 60)
    assert products["head_forward"] == ((512, 576, 49152), 1) and products["down_input_grad"] == ((586, 576, 1536), 30)


def test_profile_update_ranks_the_operators_of_one_update():
    (row,) = run("profile_update.py", "--model", "tiny", "--threads", "1", "--repeats", "1", "--top", "5")
    assert len(row["update_s"]) == len(row["optimizer_step_s"]) == 1 and row["tokens"] > 0
    shares = [op["share"] for op in row["top_self_cpu"]]
    assert len(shares) == 5 and shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1
    assert "aten::mm" in [op["op"] for op in row["top_self_cpu"]]


def test_compile_update_compares_a_compiled_trainer_with_an_eager_one():
    (row,) = run("compile_update.py", "--model", "tiny", "--threads", "1", "--steps", "1")
    assert 0 <= row["log_prob_max_abs_diff"] < 1e-5
    assert row["compiled_graphs_after_first_step"] > 0 and row["graphs_after_first_step"] == 0 and row["compile_s"] > 0
    assert set(row["median_s"]) == {"eager", "compiled"} and row["eager_over_compiled"]["step"] > 0


def test_scaling_quick_length_sweep_reports_every_point_and_draws_its_figure(tmp_path):
    *points, summary = run("scaling.py", "--quick", "--sweeps", "length", "--out", str(tmp_path))
    assert [p["max_new_tokens"] for p in points] == [8, 16] and [p["rows"] for p in points] == [4, 4]
    # the EOS lies past the model's vocabulary: every response runs to the budget; prompts are "dddd="
    assert [p["response_length_mean"] for p in points] == [8, 16] and [p["prompt_length_mean"] for p in points] == [5, 5]
    assert [p["rollout_micro_batch_rows"] for p in points] == [4, 3]          # 64 // (5 + 8), 64 // (5 + 16)
    assert [p["parameters"] for p in points] == [144_928, 144_928]           # hidden 32, 1 layer, 4,014 tokens
    for p in points:
        assert {"rollout", "actor_update", "step"} <= set(p["stage_s"]) and p["step_s"] == p["stage_s"]["step"] > 0
        assert p["tokens_per_s"] > 0 and p["step_peak_rss_mb"] >= p["rss_before_steps_mb"] > 0
    assert summary["sweep"] == "length" and summary["values"] == [8, 16] and summary["step_s_growth"][0] == 1.0
    assert summary["figure"] == str(tmp_path / "scaling_length.png")
    assert (tmp_path / "scaling_length.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "flat_32_to_256" not in summary                                   # only with 32 and 256 in the sweep


def test_vs_bare_runs_both_contenders():
    (row,) = run("vs_bare.py", "--models", "tiny", "--steps", "1", "--warmup", "0")
    assert row["nanoverl_cpu_s_per_step"] > 0 and row["bare_cpu_s_per_step"] > 0
    assert row["ratio_cpu_nanoverl_over_bare"] > 0


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed "
                    "(pip install -r benchmarks/requirements.txt)")
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_vs_trl_runs_both_contenders(precision):
    (row,) = run("vs_trl.py", "--models", "tiny", "--steps", "1", "--warmup", "0",
                 *(["--bf16"] if precision == "bfloat16" else []))
    assert row["trl_cpu_s_per_step"] > 0 and row["nanoverl_cpu_s_per_step"] > 0
    assert len(row["trl_wall_s_all"]) == len(row["nanoverl_wall_s_all"]) == 1
    assert row["precision"] == precision and row[f"gemm_gflops_{precision}"] > 0 and row["isa"]


def test_memory_stays_flat_with_micro_batches():
    *rows, summary = run("memory_flat.py", "--model", "tiny", "--batches", "2", "8", "--micro", "8",
                         "--steps", "1", "--no-contrast")
    assert [r["rows"] for r in rows] == [16, 64]
    assert summary["micro_8"]["step_peak_growth"] <= 1.10 and summary["flat"]


def test_memory_components_splits_a_run_with_a_reward_worker_and_a_critic():
    """The tiny task with PPO and a critic: each model's weights, the optimizer's state (AdamW: twice the
    actor's parameters), the step's peak, each phase's, and the reward worker processes' are reported."""
    (row,) = run("memory_components.py", "--config", "examples/configs/tiny_ppo.toml", "--steps", "2",
                 "reward.workers=1", "trainer.num_threads=1")
    assert set(row["weights"]) == {"actor", "critic"} and row["weights"]["actor"] > 0
    for part in ("actor", "critic"):
        assert row["optimizer_state"][part] == pytest.approx(2 * row["weights"][part], rel=0.05)
    assert row["step_peak"] >= row["built"] - 50 and row["children_peak"] > 0        # one reward worker process
    assert row["total_peak"] == pytest.approx(row["step_peak"] + row["children_peak"], abs=0.2)
    assert {"rollout", "log_probs", "critic_update", "update", "weight_sync"} <= set(row["phases"])
    assert row["step_peak"] >= max(row["phases"].values())                          # the step's peak is its phases'
    assert row["isa"] and row["libraries"] > 0


def test_update_memory_reports_both_paths_at_both_response_lengths_under_one_budget():
    *rows, timing, summary = run("memory_flat.py", "--update", "--model", "tiny", "--response-lengths", "4", "8",
                                 "--prompt-length", "4", "--rows", "4", "--budget", "32", "--repeats", "1")
    assert [(r["response_length"], r["chunked_head"]) for r in rows] == [(4, True), (4, False), (8, True), (8, False)]
    assert [r["micro_batches"] for r in rows] == [1, 1, 2, 2]                 # 4 x 8 tokens, then 2 x 12 per pass
    assert all(r["update_peak_rss_mb"] >= r["rss_before_update_mb"] > 0 and r["head_extra_mb"] >= 0 for r in rows)
    assert [r["head_positions"] for r in rows] == [16, 16, 16, 16]           # 4 rows x 4, 2 rows x 8
    assert len(timing["chunked_wall_s_all"]) == len(timing["plain_wall_s_all"]) == 1
    assert summary["chunked"]["update_peak_growth"] > 0 and summary["time"]["ratio_cpu_chunked_over_plain"] > 0
    assert isinstance(summary["target_met"], bool)


def test_reward_pool_scores_in_process_and_in_pools():
    *rows, summary = run("reward_pool.py", "--smoke", "--workers", "0", "2")
    assert [(r["reward"], r["workers"]) for r in rows] == [("sleep_5ms", 0), ("sleep_5ms", 2), ("busy_10us", 0),
                                                          ("busy_10us", 2)]
    assert all(r["s_per_step"] > 0 and r["rows"] == 16 for r in rows)
    assert summary["sleep_5ms_speedup_2_workers"] > 0 and "busy_10us_overhead_s_per_step_2_workers" in summary


@pytest.mark.skipif(importlib.util.find_spec("nanoverl_judge") is None, reason="needs nanoverl-judge")
def test_judge_throughput_times_concurrency_and_a_repeated_run_on_the_cache():
    (result,) = run("judge_throughput.py", "--requests", "16", "--latency-ms", "20", "--concurrency", "1", "8")
    client = result["client"]
    assert set(client["by_concurrency"]) == {"1", "8"}
    assert client["repeated_run"]["cache_hit_rate"] == 1.0 and client["repeated_run"]["requests_sent_again"] == 0


@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs peft (pip install 'nanoverl-hf[lora]')")
def test_lora_benchmark_counts_memory_and_times_both():
    memory, timing = run("lora.py", "--memory", "tiny", "--ranks", "4", "--time", "tiny", "--steps", "1", "--warmup", "0")
    # the tiny model at rank 4 on all linear layers: 8,704 adapter parameters; the full run holds a
    # second copy of the policy as its reference, the LoRA run none
    assert memory["full"]["trainable"] == 83_136 and memory["full"]["params"] == 2 * 83_136
    assert memory["lora"]["trainable"] == 8_704 and memory["lora"]["params"] == 83_136 + 8_704
    assert memory["lora"]["optimizer_mb"] < memory["full"]["optimizer_mb"] / 5
    assert timing["full"]["step_s"] > 0 and timing["lora"]["step_s"] > 0


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None or importlib.util.find_spec("peft") is None,
                    reason="needs vLLM and peft (the .venv-vllm of .ci/vllm-env.sh)")
def test_lora_vllm_benchmark_times_merged_and_adapter_sync():
    (row,) = run("lora_vllm.py", "--models", "tiny", "--prompts", "4", "--max-new-tokens", "4", "--reps", "1")
    assert row["model"] == "tiny" and row["rank"] == 8
    for mode in ("merged", "adapter"):
        assert row[mode]["sync_s"] > 0 and row[mode]["tokens_per_s"] > 0 and row[mode]["start_s"] > 0


def test_multiturn_cost_times_episodes_against_single_responses_of_as_many_tokens():
    [result] = run("multiturn_cost.py", "--model", "tiny", "--rows", "4", "--turn-tokens", "4", "--reps", "1")
    assert result["benchmark"] == "multiturn_cost" and result["rollout"] == "hf"
    assert result["model_tokens"] == {"single": 48, "episodes": 48}        # equal work: 4 rows x 3 x 4 tokens
    assert result["ratio"] > 0 and len(result["episodes_s_all"]) == 1


@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None, reason="needs the agent endpoint's packages")
def test_agents_overhead_samples_the_episode_loops_tokens():
    [result] = run("agents_overhead.py", "--rows", "4", "--turn-tokens", "4", "--reps", "1")
    assert result["benchmark"] == "agents_overhead" and result["identical"] is True
    assert result["model_tokens"] == {"episodes": 48, "agents": 48}         # 4 rows x 3 turns x 4 tokens
    assert result["ratio"] > 0 and len(result["agents_s_all"]) == 1


@pytest.mark.skipif(importlib.util.find_spec("nanoverl_reasoning_gym") is None
                    or importlib.util.find_spec("nanoverl_hf") is None,
                    reason="needs nanoverl-reasoning-gym and nanoverl-hf")
def test_data_source_reports_the_loader_against_a_tiny_step():
    (row,) = run("data_source.py", "--size", "64", "--epochs", "1", "--warmup", "0", "--block", "2")
    assert row["step_s"] > 0 and row["files_loader_s"] > 0 and row["rg_steps"] == 4 == row["rg_no_system_steps"]
    assert row["rg_rows_per_epoch"] == 64 and row["rg_prompt_tokens_mean"] > 3 * row["rg_no_system_prompt_tokens_mean"]
    assert 0 < row["rg_generate_s"] < row["rg_epoch_load_s"] and row["rg_loader_s"] > 0
    assert row["rg_step_with_loader_s"] > 0 and row["rg_alone_step_s"] > 0


def test_memory_long_runs_the_tiny_task_with_checkpoints_and_validation():
    (row,) = run("memory_long.py", "--steps", "30", "--every", "10", "--warmup", "10")
    assert row["steps"] == row["points"] == 30 and row["warmup_steps"] == 10 and row["measured_steps"] == 20
    assert row["checkpoints_kept"] == ["step_000020", "step_000030"]        # saved every 10, the last 2 kept
    assert 100 < row["rss_mib_end_of_warmup"] < 10_000 and row["max_minus_min_mib"] >= 0
    low, high = row["slope_95_interval_mib_per_100_steps"]
    assert low <= row["slope_mib_per_100_steps"] <= high and row["verdict"] in ("flat", "grows")
    assert row["children"] == 4 and row["children_rss_mib_end"] > 0         # the reward's 4 worker processes


def test_memory_long_slope_of_a_synthetic_run(tmp_path):
    """The analysis pinned by numbers: RSS = 500 + 0.05 x step + a known wiggle, after a warm-up
    whose values (far off the line) must be left out; steps logged twice (a resume replays the steps
    after its checkpoint) keep their last line."""
    import numpy as np

    wiggle = [0.0, 3.0, -1.0, -2.0]
    rows = [{"step": s, "perf/rss_mib": 900.0 if s <= 20 else 500 + 0.05 * s + wiggle[s % 4]} for s in range(1, 201)]
    killed = [{"step": s, "perf/rss_mib": 5000.0} for s in range(51, 66)]    # a kill after step 65, a resume
    rows = rows[:50] + killed + rows[50:]                                      # from step 50 logs 51-65 again
    lines = [json.dumps(r) for r in rows] + ['{"step": 201, "perf/rss']      # a line cut short by a kill
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (row,) = run("memory_long.py", "--run", str(tmp_path))
    steps = np.arange(21, 201)
    rss = 500 + 0.05 * steps + np.array([wiggle[s % 4] for s in steps])
    slope, intercept = np.polyfit(steps, rss, 1)
    residual = rss - (intercept + slope * steps)
    half = 1.97338 * np.sqrt((residual ** 2).sum() / 178 / ((steps - steps.mean()) ** 2).sum())  # t(0.975, 178)
    assert row["warmup_steps"] == 20 and row["measured_steps"] == 180 and row["steps"] == 200
    assert row["slope_mib_per_100_steps"] == pytest.approx(100 * slope, abs=1e-4)
    assert abs(100 * slope - 5.0) < 0.1                                      # the line's 0.05 MiB a step
    assert row["slope_95_interval_mib_per_100_steps"] == pytest.approx([100 * (slope - half), 100 * (slope + half)],
                                                                        abs=2e-4)
    assert row["growth_mib"] == pytest.approx(slope * 179, abs=0.01)         # ~9 MiB over the 179-step span
    assert row["rss_mib_end_of_warmup"] == pytest.approx(504.05, abs=0.06) and row["rss_mib_end"] == 510.0
    assert row["max_minus_min_mib"] == pytest.approx(max(rss) - min(rss), abs=0.01)
    assert row["threshold_mib"] == pytest.approx(0.02 * 504.05, abs=0.01)   # 2% of 504 MiB is above 8 MiB
    assert row["verdict"] == "flat"                                          # ~8.9 < 10.08
    (shorter,) = run("memory_long.py", "--run", str(tmp_path), "--warmup", "100")
    assert shorter["measured_steps"] == 100 and shorter["growth_mib"] == pytest.approx(4.95, abs=0.3)
    doubled = [{"step": r["step"], "perf/rss_mib": 500 + 0.1 * r["step"]} for r in rows if r["step"] > 20]
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, doubled)) + "\n")
    (grows,) = run("memory_long.py", "--run", str(tmp_path))
    assert grows["slope_mib_per_100_steps"] == pytest.approx(10.0) and grows["verdict"] == "grows"   # 17.9 MiB
    assert grows["slope_95_interval_mib_per_100_steps"] == pytest.approx([10.0, 10.0])              # an exact line
