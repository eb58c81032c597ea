"""verl's and TRL's key names, and the nanoverl key each one is (docs/from-verl-and-trl.md has the prose).

A config (or an override) that uses one stops with one line naming nanoverl's key:

    error: unknown config key 'data.train_batch_size' (verl's name): use data.batch_size

FOREIGN_KEYS is the one table: the error reads it and tests/test_from_verl_and_trl.py checks that every
target is a key nanoverl has and that no foreign key is one. It lives outside config/ because it names
first-party plugins' settings (as plugins.py's FIRST_PARTY does); the config package names none. verl's keys are its Hydra paths
(ppo_trainer.yaml); TRL's are `GRPOConfig` fields, which a TRL config file writes at the top level.
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError

V, T = "verl", "TRL"
_AR = "actor_rollout_ref"

FOREIGN_KEYS: dict[str, tuple[str, str, str]] = {
    # path: (whose, nanoverl key, note)
    # ---- verl: data / trainer ----
    "data.train_batch_size": (V, "data.batch_size", "prompts per step, before rollout.n samples each"),
    "data.max_response_length": (V, "rollout.max_new_tokens", ""),
    "data.reward_fn_key": (V, "data.data_source_key", ""),
    "data.filter_overlong_prompts": (V, "data.max_prompt_length", "longer prompts are always dropped and counted"),
    "trainer.total_training_steps": (V, "trainer.total_steps", ""),
    "trainer.save_freq": (V, "trainer.save_every", "0 saves only at the end"),
    "trainer.test_freq": (V, "trainer.val_every", "0 never validates"),
    "trainer.default_local_dir": (V, "trainer.output_dir", "checkpoints go to output_dir/checkpoints"),
    "trainer.resume_mode": (V, "trainer.resume", "auto / never / a checkpoint path"),
    "trainer.resume_from_path": (V, "trainer.resume", "a checkpoint path"),
    "trainer.max_actor_ckpt_to_keep": (V, "trainer.keep_checkpoints", ""),
    "trainer.logger": (V, "tracking.trackers", "console, jsonl, plot, mlflow, tensorboard, wandb"),
    "trainer.project_name": (V, "tracking.mlflow.experiment", ""),
    "trainer.experiment_name": (V, "tracking.mlflow.run_name", ""),
    "trainer.n_gpus_per_node": (V, "", "launch with torchrun --nproc-per-node N (docs/fsdp.md)"),
    # ---- verl: reward ----
    "custom_reward_function.path": (V, "reward.file", "a verl compute_score runs unchanged"),
    "custom_reward_function.name": (V, "reward.function", ""),
    "reward_model.enable": (V, "reward.name", "reward.name = \"reward_model\" (nanoverl-hf)"),
    "reward_model.overlong_buffer.len": (V, "reward.overlong_buffer_len", ""),
    "reward_model.overlong_buffer.penalty_factor": (V, "reward.overlong_penalty_factor", ""),
    # ---- verl: algorithm ----
    "algorithm.adv_estimator": (V, "algorithm.advantage_estimator", ""),
    "algorithm.norm_adv_by_std_in_grpo": (V, "algorithm.grpo.norm_by_std", ""),
    "algorithm.kl_ctrl.type": (V, "algorithm.kl_ctrl", "fixed / adaptive"),
    "algorithm.kl_ctrl.kl_coef": (V, "algorithm.kl_coef", ""),
    "algorithm.kl_ctrl.target_kl": (V, "algorithm.target_kl", ""),
    "algorithm.kl_ctrl.horizon": (V, "algorithm.kl_horizon", ""),
    "algorithm.filter_groups.enable": (V, "algorithm.filter_groups", "a bool"),
    "algorithm.filter_groups.max_num_gen_batches": (V, "algorithm.filter_groups_max_rounds", "at least 1 (verl: <= 0 is no limit)"),
    # ---- verl: actor_rollout_ref ----
    f"{_AR}.model.path": (V, "model.path", ""),
    f"{_AR}.model.enable_gradient_checkpointing": (V, "model.gradient_checkpointing", ""),
    f"{_AR}.actor.use_torch_compile": (V, "model.compile", "nanoverl compiles the blocks' norms and MLPs and the "
                                                         "LM head's log-softmax, verl its entropy and log-prob "
                                                         "functions"),
    f"{_AR}.model.lora_rank": (V, "model.lora.rank", "with model.lora.enable = true"),
    f"{_AR}.model.lora_alpha": (V, "model.lora.alpha", ""),
    f"{_AR}.model.target_modules": (V, "model.lora.target_modules", ""),
    f"{_AR}.actor.optim.lr": (V, "actor.lr", ""),
    f"{_AR}.actor.optim.weight_decay": (V, "actor.weight_decay", ""),
    f"{_AR}.actor.optim.lr_warmup_steps": (V, "actor.warmup_steps", ""),
    f"{_AR}.actor.optim.min_lr_ratio": (V, "actor.min_lr_ratio", ""),
    f"{_AR}.actor.optim.warmup_style": (V, "actor.lr_schedule", "constant / cosine / linear"),
    f"{_AR}.actor.optim.lr_scheduler_type": (V, "actor.lr_schedule", "constant / cosine / linear"),
    f"{_AR}.actor.grad_clip": (V, "actor.grad_clip", ""),
    f"{_AR}.actor.ppo_epochs": (V, "actor.ppo_epochs", ""),
    f"{_AR}.actor.ppo_mini_batch_size": (V, "actor.mini_batch_size", "prompts per optimizer step, as in verl"),
    f"{_AR}.actor.ppo_micro_batch_size_per_gpu": (V, "actor.micro_batch_size", "rows per forward/backward"),
    f"{_AR}.actor.ppo_max_token_len_per_gpu": (V, "actor.max_tokens_per_micro_batch", "verl's use_dynamic_bsz"),
    f"{_AR}.actor.clip_ratio": (V, "actor.clip_ratio_low", "and actor.clip_ratio_high"),
    f"{_AR}.actor.clip_ratio_low": (V, "actor.clip_ratio_low", ""),
    f"{_AR}.actor.clip_ratio_high": (V, "actor.clip_ratio_high", ""),
    f"{_AR}.actor.clip_ratio_c": (V, "actor.clip_ratio_c", ""),
    f"{_AR}.actor.loss_agg_mode": (V, "actor.loss_agg_mode", ""),
    f"{_AR}.actor.policy_loss.loss_mode": (V, "actor.policy_loss", ""),
    f"{_AR}.actor.entropy_coeff": (V, "actor.entropy_coeff", ""),
    f"{_AR}.actor.use_kl_loss": (V, "actor.use_kl_loss", "with reference.enable = true"),
    f"{_AR}.actor.kl_loss_coef": (V, "actor.kl_loss_coef", ""),
    f"{_AR}.actor.kl_loss_type": (V, "actor.kl_loss_type", ""),
    f"{_AR}.rollout.name": (V, "rollout.name", ""),
    f"{_AR}.rollout.n": (V, "rollout.n", ""),
    f"{_AR}.rollout.temperature": (V, "rollout.temperature", ""),
    f"{_AR}.rollout.top_p": (V, "rollout.top_p", ""),
    f"{_AR}.rollout.top_k": (V, "rollout.top_k", "0 disables (verl: -1)"),
    f"{_AR}.rollout.response_length": (V, "rollout.max_new_tokens", ""),
    f"{_AR}.rollout.prompt_length": (V, "data.max_prompt_length", ""),
    f"{_AR}.rollout.gpu_memory_utilization": (V, "rollout.vllm.gpu_memory_utilization", ""),
    f"{_AR}.rollout.val_kwargs.temperature": (V, "rollout.val_temperature", ""),
    f"{_AR}.rollout.val_kwargs.n": (V, "rollout.val_n", ""),
    # ---- verl: critic (the keys that differ) ----
    "critic.optim.lr": (V, "critic.lr", ""),
    "critic.ppo_mini_batch_size": (V, "critic.mini_batch_size", ""),
    "critic.ppo_micro_batch_size_per_gpu": (V, "critic.micro_batch_size", ""),
    # ---- TRL: GRPOConfig fields ----
    "learning_rate": (T, "actor.lr", ""),
    "num_generations": (T, "rollout.n", ""),
    "num_generations_eval": (T, "rollout.val_n", ""),
    "max_completion_length": (T, "rollout.max_new_tokens", ""),
    "max_prompt_length": (T, "data.max_prompt_length", ""),
    "temperature": (T, "rollout.temperature", ""),
    "top_p": (T, "rollout.top_p", ""),
    "top_k": (T, "rollout.top_k", ""),
    "per_device_train_batch_size": (T, "data.batch_size", "nanoverl counts prompts per step: per_device_train_batch_"
                                                          "size * gradient_accumulation_steps * processes / "
                                                          "num_generations"),
    "gradient_accumulation_steps": (T, "actor.micro_batch_size", "rows per forward/backward; the mini-batch is "
                                                                 "actor.mini_batch_size"),
    "steps_per_generation": (T, "actor.mini_batch_size", "data.batch_size / steps_per_generation prompts per "
                                                         "optimizer step"),
    "num_iterations": (T, "actor.ppo_epochs", ""),
    "beta": (T, "actor.kl_loss_coef", "with actor.use_kl_loss = true, reference.enable = true, "
                                      "actor.kl_loss_type = \"k3\""),
    "epsilon": (T, "actor.clip_ratio_low", "and actor.clip_ratio_high unless epsilon_high is set"),
    "epsilon_high": (T, "actor.clip_ratio_high", "with loss_type cispo: [actor.cispo] eps_high = epsilon_high - 1"),
    "delta": (T, "actor.clip_ratio_c", "TRL's two-sided clip is the dual clip"),
    "loss_type": (T, "actor.policy_loss", "and actor.loss_agg_mode: the loss_type table in "
                                          "docs/from-verl-and-trl.md"),
    "importance_sampling_level": (T, "actor.policy_loss", "\"sequence\" is actor.policy_loss = \"gspo\""),
    "scale_rewards": (T, "algorithm.grpo.norm_by_std", "\"none\" is false (or algorithm.advantage_estimator = "
                                                       "\"dr_grpo\")"),
    "sapo_temperature_pos": (T, "actor.sapo.tau_pos", ""),
    "sapo_temperature_neg": (T, "actor.sapo.tau_neg", ""),
    "mask_truncated_completions": (T, "algorithm.mask_truncated", ""),
    "reward_weights": (T, "reward.components", "[[reward.components]] with a weight each"),
    "entropy_coef": (T, "actor.entropy_coeff", ""),
    "max_grad_norm": (T, "actor.grad_clip", ""),
    "weight_decay": (T, "actor.weight_decay", ""),
    "warmup_steps": (T, "actor.warmup_steps", ""),
    "lr_scheduler_type": (T, "actor.lr_schedule", "constant / cosine / linear"),
    "gradient_checkpointing": (T, "model.gradient_checkpointing", ""),
    "torch_compile": (T, "model.compile", "torch.compile of the blocks' norms and MLPs and the LM head's "
                                         "log-softmax"),
    "bf16": (T, "model.compute_dtype", "model.compute_dtype = \"bfloat16\": bf16 autocast over float32 weights"),
    "use_vllm": (T, "rollout.name", "rollout.name = \"vllm\""),
    "vllm_gpu_memory_utilization": (T, "rollout.vllm.gpu_memory_utilization", ""),
    "max_steps": (T, "trainer.total_steps", ""),
    "num_train_epochs": (T, "trainer.total_epochs", "passes over the training rows"),
    "save_steps": (T, "trainer.save_every", ""),
    "eval_steps": (T, "trainer.val_every", ""),
    "save_total_limit": (T, "trainer.keep_checkpoints", ""),
    "resume_from_checkpoint": (T, "trainer.resume", ""),
    "output_dir": (T, "trainer.output_dir", ""),
    "seed": (T, "trainer.seed", ""),
    "report_to": (T, "tracking.trackers", ""),
    "model_name_or_path": (T, "model.path", "a local folder"),
    "dataset_name": (T, "data.train_files", "local jsonl / json / parquet files"),
}

VERL_ONLY_SECTIONS = ("actor_rollout_ref", "custom_reward_function", "reward_model", "ray_kwargs", "ray_init",
                      "global_profiler")
"""Top-level sections only verl has: a key under one that FOREIGN_KEYS lacks is named as verl's."""


def foreign_key_message(path: str) -> str | None:
    """The error line for a verl / TRL key (None if `path` is not one)."""
    if path in FOREIGN_KEYS:
        whose, target, note = FOREIGN_KEYS[path]
        use = (f"use {target}" + (f" ({note})" if note else "")) if target else note
        return f"unknown config key {path!r} ({whose}'s name): {use}; docs/from-verl-and-trl.md maps the rest"
    if path.split(".", 1)[0] in VERL_ONLY_SECTIONS:
        return (f"unknown config key {path!r} (a verl key): nanoverl has no key for it; "
                "docs/from-verl-and-trl.md maps the verl keys that have one")
    return None


def check_foreign_keys(data: dict[str, Any], prefix: str = "") -> None:
    """The first verl / TRL key anywhere in `data` (a parsed file with its overrides) as one ConfigError."""
    for key, value in data.items():
        path = f"{prefix}{key}"
        message = foreign_key_message(path) if not isinstance(value, dict) or path in FOREIGN_KEYS else None
        if message:
            raise ConfigError(message)
        if isinstance(value, dict):
            check_foreign_keys(value, path + ".")
