"""verl's and TRL's key names and values, and the nanoverl settings each one is (docs/from-verl-and-trl.md
has the prose).

A config (or an override) that uses any stops with one line naming every one of them, each with
nanoverl's setting and, where the meanings differ, the value translated:

    error: 2 keys are verl's or TRL's, not nanoverl's: 'data.train_batch_size' (verl's name): use
    data.batch_size=64 (...); 'algorithm.adv_estimator' (verl's name): use algorithm.advantage_estimator=gae
    critic.enable=true; ...

FOREIGN_KEYS is the one table: the error, `nanoverl_core.translate` (the `nanoverl-train translate`
command) and `foreign_name_hint` (an unknown registry name that is verl's or TRL's) read it, and
tests/test_from_verl_and_trl.py checks that every target is a key nanoverl has and that no foreign key
is one. TRL_LOSS_TYPES is the `loss_type` table of the docs page, whose every row
tests/test_trl_loss_types.py checks against TRL's formula and against `translate`. It lives outside
config/ because it names first-party plugins' settings (as plugins.py's FIRST_PARTY does); the config
package names none. verl's keys are its Hydra paths (ppo_trainer.yaml); TRL's are `GRPOConfig` fields,
which a TRL config file writes at the top level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .errors import ConfigError

V, T = "verl", "TRL"
_AR = "actor_rollout_ref"


class Untranslatable(Exception):
    """A foreign value with no nanoverl equivalent; the message says why."""


class Foreign(NamedTuple):
    whose: str
    """"verl" or "TRL"."""
    key: str
    """The nanoverl key ("" where there is none)."""
    note: str
    value: Callable[[Any, dict[str, Any]], dict[str, Any]] | None = None
    """Where the meanings differ: (the foreign value, every foreign key given with its value) -> the nanoverl
    settings; None: the value carries over to `key` unchanged."""


def _same(*keys: str) -> Callable:
    """The value for each of `keys` (verl's clip_ratio is both of nanoverl's bounds)."""
    return lambda v, given: dict.fromkeys(keys, v)


def _switch(key: str, on: Any) -> Callable:
    """A foreign bool that turns on `key = on` (false: nothing to set)."""
    def translate(v, given):
        return {key: on} if _true(v) else {}
    return translate


def _true(v: Any) -> bool:
    return v is True or str(v).lower() in ("true", "1", "yes")


VERL_ESTIMATORS = {"gae": "gae", "grpo": "grpo", "grpo_vectorized": "grpo", "rloo": "rloo", "rloo_vectorized": "rloo",
                   "reinforce_plus_plus": "reinforce_plus_plus", "reinforce_plus_plus_baseline":
                   "reinforce_plus_plus_baseline", "remax": "remax", "opo": "opo", "grpo_passk": "grpo_passk",
                   "gpg": "gpg", "optimal_token_baseline": "optimal_token_baseline", "gdpo": "gdpo"}
"""verl's `algorithm.adv_estimator` values and nanoverl's estimator of the same computation."""


def _estimator(v, given) -> dict[str, Any]:
    if v not in VERL_ESTIMATORS:
        raise Untranslatable(f"verl's estimator {v!r} has no nanoverl estimator (nanoverl-train plugins lists them)")
    return {"algorithm.advantage_estimator": VERL_ESTIMATORS[v], **({"critic.enable": True} if v == "gae" else {})}


def _top_k(v, given) -> dict[str, Any]:
    return {"rollout.top_k": 0 if isinstance(v, int) and v < 0 else v}


def _resume(v, given) -> dict[str, Any]:
    if v == "resume_path":
        return {"trainer.resume": given.get("trainer.resume_from_path", "auto")}
    if v in ("auto", "disable"):
        return {"trainer.resume": "never" if v == "disable" else "auto"}
    raise Untranslatable(f"verl's resume_mode {v!r} is auto, disable or resume_path")


VERL_LOGGERS = {"console": "console", "file": "jsonl", "mlflow": "mlflow", "tensorboard": "tensorboard",
                "wandb": "wandb"}


def _trackers(v, given, names: dict[str, str] = VERL_LOGGERS) -> dict[str, Any]:
    wanted = [v] if isinstance(v, str) else list(v or [])
    if wanted in (["none"], []):
        return {"tracking.trackers": ["console", "jsonl", "plot"]}
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise Untranslatable(f"{', '.join(map(str, unknown))}: no nanoverl tracker ({', '.join(sorted(names))} are)")
    trackers = ["console", "jsonl", "plot"] if names is TRL_REPORTERS else []
    return {"tracking.trackers": list(dict.fromkeys(trackers + [names[w] for w in wanted]))}


TRL_REPORTERS = {"mlflow": "mlflow", "tensorboard": "tensorboard", "wandb": "wandb"}


def _max_rounds(v, given) -> dict[str, Any]:
    if isinstance(v, int) and v <= 0:
        raise Untranslatable("verl's <= 0 (no limit) has no nanoverl equivalent: algorithm.filter_groups_max_rounds "
                             "is at least 1; set a number")
    return {"algorithm.filter_groups_max_rounds": v}


def _filter_overlong(v, given) -> dict[str, Any]:
    if _true(v):
        return {}
    raise Untranslatable("nanoverl always drops prompts longer than data.max_prompt_length (and counts them)")


# ---- TRL: the loss, the batch sizes, the KL term -------------------------------------------------------------
TRL_LOSS_TYPES: dict[str, dict[str, Any] | None] = {
    "dapo": {"actor.policy_loss": "vanilla", "actor.loss_agg_mode": "token-mean", "actor.clip_ratio_c": 1e9},
    "grpo": {"actor.policy_loss": "vanilla", "actor.loss_agg_mode": "seq-mean-token-mean", "actor.clip_ratio_c": 1e9},
    "bnpo": {"actor.policy_loss": "vanilla", "actor.loss_agg_mode": "token-mean", "actor.clip_ratio_c": 1e9},
    "dr_grpo": {"actor.policy_loss": "vanilla", "actor.loss_agg_mode": "seq-mean-token-sum-norm",
                "actor.clip_ratio_c": 1e9},
    "cispo": {"actor.policy_loss": "cispo", "actor.loss_agg_mode": "token-mean"},
    "sapo": {"actor.policy_loss": "sapo", "actor.loss_agg_mode": "seq-mean-token-mean"},
    "luspo": None,   # only with importance_sampling_level="sequence" (TRL_SEQUENCE_LOSS_TYPES)
    "vespo": None,
}
"""TRL 1.16's `loss_type` values as nanoverl settings (token-level importance sampling): the table of
docs/from-verl-and-trl.md ("TRL's loss_type"), which tests/test_trl_loss_types.py checks row by row against
TRL's formula. None: no single setting computes it. The PPO-family rows set clip_ratio_c = 1e9 because TRL
clips one-sidedly unless `delta` is set (then delta is the dual clip)."""

TRL_SEQUENCE_LOSS_TYPES = {
    "grpo": {"actor.policy_loss": "gspo", "actor.loss_agg_mode": "seq-mean-token-mean"},
    "luspo": {"actor.policy_loss": "gspo", "actor.loss_agg_mode": "seq-mean-token-sum"},
}
"""`loss_type` with `importance_sampling_level="sequence"`: GSPO, and LUSPO (GSPO's loss times the length)."""

TRL_DEFAULTS: dict[str, Any] = {"loss_type": "dapo", "scale_rewards": "group", "num_generations": 8,
                                "gradient_accumulation_steps": 1, "importance_sampling_level": "token"}
"""TRL 1.16 `GRPOConfig` defaults that `translate` assumes for a field a TRL config leaves out, where nanoverl's
default computes something else (a GRPOConfig without loss_type trains with "dapo")."""


def _loss_type(v, given) -> dict[str, Any]:
    sequence = given.get("importance_sampling_level", "token") == "sequence"
    row = (TRL_SEQUENCE_LOSS_TYPES if sequence else TRL_LOSS_TYPES).get(v)
    if row is None:
        level = ' with importance_sampling_level="sequence"' if sequence else ""
        raise Untranslatable(f"TRL's loss_type {v!r}{level} has no nanoverl loss (the loss_type table of "
                             "docs/from-verl-and-trl.md)")
    out = dict(row)
    if v == "cispo":
        if "epsilon_high" not in given:
            raise Untranslatable("TRL's cispo without epsilon_high caps the weight at epsilon (< 1), which "
                                 "[actor.cispo] eps_high (> 0) cannot write")
        out["actor.cispo.eps_high"] = float(given["epsilon_high"]) - 1
    if "delta" in given and "actor.clip_ratio_c" in out:
        out["actor.clip_ratio_c"] = given["delta"]
    return out


def _epsilon(v, given) -> dict[str, Any]:
    return {"actor.clip_ratio_low": v, **({} if "epsilon_high" in given else {"actor.clip_ratio_high": v})}


def _epsilon_high(v, given) -> dict[str, Any]:
    return {} if given.get("loss_type") == "cispo" else {"actor.clip_ratio_high": v}


def _beta(v, given) -> dict[str, Any]:
    if not v:
        return {}
    return {"reference.enable": True, "actor.use_kl_loss": True, "actor.kl_loss_coef": v, "actor.kl_loss_type": "k3"}


def _importance_level(v, given) -> dict[str, Any]:
    if v == "token" or "loss_type" in given:
        return {}  # read by loss_type's translation
    return _loss_type(TRL_DEFAULTS["loss_type"], {**given, "importance_sampling_level": v})


def _scale_rewards(v, given) -> dict[str, Any]:
    if v in ("group", True, "true", "True"):
        return {"algorithm.advantage_estimator": "grpo", "algorithm.grpo.norm_by_std": True, "algorithm.grpo.epsilon": 1e-4}
    if v in ("none", False, "false", "False"):
        return {"algorithm.advantage_estimator": "dr_grpo"}
    raise Untranslatable(f"TRL's scale_rewards={v!r}: nanoverl divides by the group's std or by nothing, never by "
                         "the batch's")


def _prompts(rows: Any, given: dict[str, Any], what: str) -> int:
    """Completions per process (`rows`) as prompts (TRL: / num_generations, on one process)."""
    n = int(given.get("num_generations", TRL_DEFAULTS["num_generations"]))
    if int(rows) % n:
        raise Untranslatable(f"{what} = {rows} completions is not a whole number of prompts of num_generations = {n}")
    return int(rows) // n


def _per_device_batch(v, given) -> dict[str, Any]:
    accumulation = int(given.get("gradient_accumulation_steps", TRL_DEFAULTS["gradient_accumulation_steps"]))
    steps = int(given.get("steps_per_generation", accumulation))
    return {"data.batch_size": _prompts(int(v) * steps, given, "per_device_train_batch_size * steps_per_generation"),
            "actor.micro_batch_size": int(v)}


def _accumulation(v, given) -> dict[str, Any]:
    per_device = given.get("per_device_train_batch_size")
    if per_device is None:
        raise Untranslatable("an optimizer step of per_device_train_batch_size * gradient_accumulation_steps "
                             "completions: give per_device_train_batch_size too")
    return {"actor.mini_batch_size": _prompts(int(per_device) * int(v), given,
                                              "per_device_train_batch_size * gradient_accumulation_steps")}


_TABLE: dict[str, tuple] = {
    # path: (whose, nanoverl key, note[, value translation])
    # ---- verl: data / trainer ----
    "data.train_batch_size": (V, "data.batch_size", "prompts per step, before rollout.n samples each"),
    "data.max_response_length": (V, "rollout.max_new_tokens", ""),
    "data.reward_fn_key": (V, "data.data_source_key", ""),
    "data.filter_overlong_prompts": (V, "data.max_prompt_length", "longer prompts are always dropped and counted",
                                     _filter_overlong),
    "trainer.total_training_steps": (V, "trainer.total_steps", ""),
    "trainer.save_freq": (V, "trainer.save_every", "0 saves only at the end"),
    "trainer.test_freq": (V, "trainer.val_every", "0 never validates"),
    "trainer.default_local_dir": (V, "trainer.output_dir", "checkpoints go to output_dir/checkpoints"),
    "trainer.resume_mode": (V, "trainer.resume", "auto / never / a checkpoint path", _resume),
    "trainer.resume_from_path": (V, "trainer.resume", "a checkpoint path"),
    "trainer.max_actor_ckpt_to_keep": (V, "trainer.keep_checkpoints", ""),
    "trainer.logger": (V, "tracking.trackers", "console, jsonl, plot, mlflow, tensorboard, wandb", _trackers),
    "trainer.project_name": (V, "tracking.mlflow.experiment", ""),
    "trainer.experiment_name": (V, "tracking.mlflow.run_name", ""),
    "trainer.n_gpus_per_node": (V, "", "launch with torchrun --nproc-per-node N (docs/fsdp.md)"),
    "trainer.nnodes": (V, "", "launch with torchrun --nnodes N on every node (docs/fsdp.md)"),
    # ---- verl: reward ----
    "custom_reward_function.path": (V, "reward.file", "a verl compute_score runs unchanged"),
    "custom_reward_function.name": (V, "reward.function", ""),
    "reward_model.enable": (V, "reward.name", "reward.name = \"reward_model\" (nanoverl-hf)",
                            _switch("reward.name", "reward_model")),
    "reward_model.overlong_buffer.len": (V, "reward.overlong_buffer_len", ""),
    "reward_model.overlong_buffer.penalty_factor": (V, "reward.overlong_penalty_factor", ""),
    # ---- verl: algorithm ----
    "algorithm.adv_estimator": (V, "algorithm.advantage_estimator", "gae needs critic.enable = true", _estimator),
    "algorithm.norm_adv_by_std_in_grpo": (V, "algorithm.grpo.norm_by_std", ""),
    "algorithm.kl_ctrl.type": (V, "algorithm.kl_ctrl", "fixed / adaptive"),
    "algorithm.kl_ctrl.kl_coef": (V, "algorithm.kl_coef", ""),
    "algorithm.kl_ctrl.target_kl": (V, "algorithm.target_kl", ""),
    "algorithm.kl_ctrl.horizon": (V, "algorithm.kl_horizon", ""),
    "algorithm.filter_groups.enable": (V, "algorithm.filter_groups", "a bool"),
    "algorithm.filter_groups.max_num_gen_batches": (V, "algorithm.filter_groups_max_rounds",
                                                    "at least 1 (verl: <= 0 is no limit)", _max_rounds),
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
    f"{_AR}.actor.clip_ratio": (V, "actor.clip_ratio_low", "and actor.clip_ratio_high",
                               _same("actor.clip_ratio_low", "actor.clip_ratio_high")),
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
    f"{_AR}.rollout.top_k": (V, "rollout.top_k", "0 disables (verl: -1)", _top_k),
    f"{_AR}.rollout.response_length": (V, "rollout.max_new_tokens", ""),
    f"{_AR}.rollout.prompt_length": (V, "data.max_prompt_length", ""),
    f"{_AR}.rollout.gpu_memory_utilization": (V, "rollout.vllm.gpu_memory_utilization", ""),
    f"{_AR}.rollout.val_kwargs.temperature": (V, "rollout.val_temperature", ""),
    f"{_AR}.rollout.val_kwargs.n": (V, "rollout.val_n", ""),
    # ---- verl: critic (the keys that differ) ----
    "critic.optim.lr": (V, "critic.lr", ""),
    "critic.model.path": (V, "", "nanoverl's critic starts from model.path, with a value head"),
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
                                                          "num_generations; the rows per forward/backward are "
                                                          "actor.micro_batch_size", _per_device_batch),
    "gradient_accumulation_steps": (T, "actor.mini_batch_size", "prompts per optimizer step: per_device_train_batch_"
                                                                "size * gradient_accumulation_steps / num_generations",
                                    _accumulation),
    "steps_per_generation": (T, "actor.mini_batch_size", "data.batch_size / steps_per_generation prompts per "
                                                         "optimizer step"),
    "num_iterations": (T, "actor.ppo_epochs", ""),
    "beta": (T, "actor.kl_loss_coef", "with actor.use_kl_loss = true, reference.enable = true, "
                                      "actor.kl_loss_type = \"k3\"", _beta),
    "epsilon": (T, "actor.clip_ratio_low", "and actor.clip_ratio_high unless epsilon_high is set", _epsilon),
    "epsilon_high": (T, "actor.clip_ratio_high", "with loss_type cispo: [actor.cispo] eps_high = epsilon_high - 1",
                     _epsilon_high),
    "delta": (T, "actor.clip_ratio_c", "TRL's two-sided clip is the dual clip"),
    "loss_type": (T, "actor.policy_loss", "and actor.loss_agg_mode: the loss_type table in "
                                          "docs/from-verl-and-trl.md", _loss_type),
    "importance_sampling_level": (T, "actor.policy_loss", "\"sequence\" is actor.policy_loss = \"gspo\"",
                                  _importance_level),
    "scale_rewards": (T, "algorithm.grpo.norm_by_std", "\"none\" is false (or algorithm.advantage_estimator = "
                                                       "\"dr_grpo\")", _scale_rewards),
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
    "bf16": (T, "model.compute_dtype", "model.compute_dtype = \"bfloat16\": bf16 autocast over float32 weights",
             _switch("model.compute_dtype", "bfloat16")),
    "use_vllm": (T, "rollout.name", "rollout.name = \"vllm\"", _switch("rollout.name", "vllm")),
    "vllm_gpu_memory_utilization": (T, "rollout.vllm.gpu_memory_utilization", ""),
    "max_steps": (T, "trainer.total_steps", ""),
    "num_train_epochs": (T, "trainer.total_epochs", "passes over the training rows"),
    "save_steps": (T, "trainer.save_every", ""),
    "eval_steps": (T, "trainer.val_every", ""),
    "save_total_limit": (T, "trainer.keep_checkpoints", ""),
    "resume_from_checkpoint": (T, "trainer.resume", ""),
    "output_dir": (T, "trainer.output_dir", ""),
    "seed": (T, "trainer.seed", ""),
    "report_to": (T, "tracking.trackers", "", lambda v, given: _trackers(v, given, TRL_REPORTERS)),
    "model_name_or_path": (T, "model.path", "a local folder"),
    "dataset_name": (T, "data.train_files", "local jsonl / json / parquet files"),
}

FOREIGN_KEYS: dict[str, Foreign] = {path: Foreign(*entry) for path, entry in _TABLE.items()}

VERL_ONLY_SECTIONS = ("actor_rollout_ref", "custom_reward_function", "reward_model", "ray_kwargs", "ray_init",
                      "global_profiler")
"""Top-level sections only verl has: a key under one that FOREIGN_KEYS lacks is named as verl's."""


def shown_value(value: Any) -> str:
    """A value as an override writes it (`true`, `1e-6`, `[console,wandb]`: one shell word)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(shown_value(v) for v in value) + "]"  # one shell word
    if isinstance(value, float) and "e" in f"{value:g}":  # 1e9, 1e-6: as the docs write them
        mantissa, exponent = f"{value:g}".split("e")
        return f"{mantissa}e{int(exponent)}"
    return str(value)


def translate_key(path: str, value: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The nanoverl settings of one foreign `path = value` ({} where nothing needs setting); Untranslatable
    where there are none; KeyError for a path that is not foreign."""
    entry = FOREIGN_KEYS[path]
    if entry.value is not None:
        return entry.value(value, given)
    if not entry.key:
        raise Untranslatable(entry.note)
    return {entry.key: value}


def foreign_key_message(path: str, value: Any = None, given: dict[str, Any] | None = None) -> str | None:
    """What to write instead of the verl / TRL key `path` (None if it is not one): its nanoverl settings with
    `value` translated, or why there are none."""
    if path in FOREIGN_KEYS:
        whose, target, note, translated = FOREIGN_KEYS[path]
        try:
            settings = translate_key(path, value, given or {path: value}) if value is not None else None
        except (Untranslatable, TypeError, ValueError) as exc:
            reason = str(exc) if isinstance(exc, Untranslatable) else note
            return f"{path!r} ({whose}'s name): " + (f"use {target}, but {reason}" if target else reason)
        if settings == {}:
            return f"{path!r} ({whose}'s name): nothing to set for this value ({target}: {note})"
        use = " ".join(f"{k}={shown_value(v)}" for k, v in settings.items()) if settings else target
        if not use:
            return f"{path!r} ({whose}'s name): {note}"
        shown_note = note and not (settings and translated)  # a translated value says what the note would
        return f"{path!r} ({whose}'s name): use {use}" + (f" ({note})" if shown_note else "")
    if path.split(".", 1)[0] in VERL_ONLY_SECTIONS:
        return f"{path!r} (a verl key): nanoverl has no key for it"
    return None


def foreign_paths(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every verl / TRL key anywhere in `data` (a parsed file with its overrides), with its value."""
    found = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if (not isinstance(value, dict) or path in FOREIGN_KEYS) and foreign_key_message(path) is not None:
            found[path] = value
        elif isinstance(value, dict):
            found.update(foreign_paths(value, path + "."))
    return found


def check_foreign_keys(data: dict[str, Any], known: Callable[[str], bool] | None = None) -> None:
    """One ConfigError naming every verl / TRL key in `data`, each with its nanoverl settings, and, when there
    are any, the other keys nanoverl does not know either (`known(path)`: a nanoverl key), so one run names
    everything a translated command still has to change."""
    found = foreign_paths(data)
    if not found:
        return
    parts = [foreign_key_message(path, value, found) for path, value in found.items()]
    unknown = [path for path in _leaf_paths(data) if path not in found and not any(
        path.startswith(f + ".") for f in found) and known is not None and not known(path)]
    head = ("unknown config key " if len(parts) == 1 else
            f"{len(parts)} keys are verl's or TRL's, not nanoverl's: ")
    tail = (f"; not nanoverl keys either: {', '.join(unknown)}" if unknown else "")
    raise ConfigError(head + "; ".join(parts) + tail + "; docs/from-verl-and-trl.md maps the rest, and "
                      "`nanoverl-train translate` rewrites a whole verl command or TRL GRPOConfig")


def _leaf_paths(data: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        out += _leaf_paths(value, path + ".") if isinstance(value, dict) and value else [path]
    return out


# ---- names: a verl or TRL value where a registered name is expected ---------------------------------------
def foreign_name_hint(kind: str, name: str) -> str | None:
    """For an unknown registry name that is verl's or TRL's name of something else (TRL's loss_type values as
    actor.policy_loss, PPO as an estimator): the nanoverl settings it means, instead of a look-alike name."""
    if kind == "policy_loss" and name in TRL_LOSS_TYPES:
        row = TRL_LOSS_TYPES[name] or TRL_SEQUENCE_LOSS_TYPES.get(name)
        if row is None:
            return f"{name!r} is TRL's loss_type {name!r}, which no nanoverl loss computes"
        settings = " ".join(f"{k}={shown_value(v)}" for k, v in row.items())
        level = ' (with importance_sampling_level="sequence")' if TRL_LOSS_TYPES[name] is None else ""
        return f"{name!r} is TRL's loss_type{level}; in nanoverl: {settings}"
    if kind in ("policy_loss", "advantage_estimator") and name == "ppo":
        return ("PPO is the vanilla policy loss (actor.policy_loss=vanilla) with GAE advantages from a critic "
                "(algorithm.advantage_estimator=gae critic.enable=true)")
    if kind == "advantage_estimator" and VERL_ESTIMATORS.get(name, name) != name:
        return f"{name!r} is verl's vectorised {VERL_ESTIMATORS[name]}: algorithm.advantage_estimator={VERL_ESTIMATORS[name]}"
    return None
