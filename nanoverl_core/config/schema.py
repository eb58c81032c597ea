"""The typed config tree: one attrs class per section, one docstring per field.

Files are TOML, YAML or JSON; command-line overrides are dotted paths (``trainer.total_steps=20``).
Structuring goes through cattrs with unknown keys forbidden, so a typo is reported with its key path
and the closest valid key. Cross-field rules (batch sizes that divide, a critic setting with the
critic off, ...) live in ``Config.validate`` and run before any model loads.
"""

import difflib
import json
import math
import re
import sys
import tomllib
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import attrs
import cattrs
import cattrs.v
import yaml

from ..errors import ConfigError

LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                      "seq-mean-token-sum-norm"]
def _settings(**kwargs):
    """A component's typed settings: not a key the user writes under this name (see `component_settings`)."""
    return attrs.field(default=None, init=False, **kwargs)


KLEstimator = Literal["k1", "abs", "k2", "k3", "k1+", "abs+", "k2+", "k3+", "low_var_kl", "mse", "kl"]


@attrs.define
class TrainerConfig:
    total_steps: int = 100
    """Trainer steps (one rollout batch and one policy update each)."""
    seed: int = 0
    """Seeds python, numpy and torch; every run with the same seed and config is identical on CPU."""
    output_dir: str = "runs/demo"
    """The run directory: config.json, metrics.jsonl, rollouts/, checkpoints/."""
    save_every: int = 50
    """Checkpoint period in steps; 0 saves only at the end."""
    val_every: int = 25
    """Validation period in steps; 0 never validates."""
    val_before_train: bool = False
    """Validate once before the first step (logged as step 0)."""
    eval_before_after: bool = False
    """Evaluate on data.val_files before the first step and after the last, greedy and sampled
    (the `nanoverl-train eval` table): printed, and written to eval.json in the run directory."""
    resume: str = "auto"
    """"auto" (newest complete checkpoint in output_dir), "never", or a checkpoint folder path."""
    keep_checkpoints: int = 2
    """How many complete checkpoints to keep; older ones are deleted after a successful save."""
    critic_warmup: int = 0
    """Steps during which only the critic is updated (the actor waits)."""
    rollout_samples: int = 8
    """Samples per step written to rollouts/step_<N>.jsonl; 0 writes none, -1 writes all."""
    device: str = "auto"
    """"auto" (cuda if available), "cpu", or "cuda" / "cuda:N"."""
    num_threads: int = 0
    """torch intra-op threads; 0 keeps torch's default. One thread is often fastest for tiny models."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """A NaN/inf loss or gradient: "stop" ends the run (exit 2, last checkpoint kept), "skip" drops the update."""
    progress: Literal["auto", "bar", "log", "none"] = "auto"
    """Progress display: a bar on an interactive terminal, plain log lines otherwise."""


@attrs.define
class DataConfig:
    train_files: list[str] = attrs.Factory(list)
    """jsonl / json / parquet files of training prompts, loaded with `datasets`."""
    val_files: list[str] = attrs.Factory(list)
    """Validation files; empty disables validation."""
    prompt_key: str = "prompt"
    """Column holding the prompt: a string, or a chat message list rendered with the chat template."""
    data_source_key: str = "data_source"
    """Column used to group validation summaries (val/<source>/reward/mean); missing -> "default"."""
    batch_size: int = 16
    """Prompts per step (before sampling n responses each)."""
    val_batch_size: int = 64
    """Prompts per validation generate call."""
    max_prompt_length: int = 256
    """Prompts with more tokens are filtered out at load time (the count is logged)."""
    shuffle: bool = True
    """Reshuffle the training prompts every epoch (seeded by trainer.seed and the epoch)."""
    apply_chat_template: bool = True
    """Render chat-format prompts through the tokenizer's chat template (a tokenizer without one is an
    error); false joins the messages' contents with newlines."""


TargetModules = str | list[str]


@attrs.define
class LoraConfig:
    """[model.lora]: train a low-rank adapter (peft) instead of every weight; needs nanoverl-hf[lora]."""

    enable: bool = False
    """Train a LoRA adapter on the frozen base model (policy, and the critic with a full value head);
    the reference is the same module with the adapter disabled (no second copy)."""
    rank: int = 8
    """Adapter rank r (peft LoraConfig.r): trainable parameters per adapted layer r * (in + out)."""
    alpha: float = 16.0
    """LoRA alpha: the adapter's output is scaled by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapter's input in the update's forward (log-prob passes run without it)."""
    target_modules: TargetModules = "all-linear"
    """"all-linear" (every linear layer but the output head) or a list of module names, e.g. ["q_proj", "v_proj"]."""


@attrs.define
class ModelConfig:
    path: str = ""
    """A local Hugging Face model folder, or a .gguf file (see README); empty for the debug worker."""
    tokenizer_path: str = ""
    """Tokenizer folder if not the model folder."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype for training and rollout."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    trust_remote_code: bool = False
    """Allow model code from the model folder to run (off: only transformers' own classes)."""
    lora: LoraConfig = attrs.Factory(LoraConfig)
    """LoRA: rank, alpha, dropout, target modules (off by default: full fine-tuning)."""


@attrs.define
class RolloutConfig:
    name: str = "debug"
    """A registered rollout engine (`nanoverl-train plugins` lists them)."""
    n: int = 1
    """Responses sampled per prompt; rows sampled from one prompt share a uid."""
    max_new_tokens: int = 32
    """Maximum response length; generation stops earlier once every sequence hit EOS."""
    temperature: float = 1.0
    """Sampling temperature; log-probs for training use the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1.0 disables)."""
    top_k: int = 0
    """Top-k sampling (0 disables)."""
    val_n: int = 1
    """Samples per validation prompt when val_temperature > 0 (mean@n and best@n are logged; greedy
    validation takes one), and for the sampled row of eval / trainer.eval_before_after."""
    val_temperature: float = 0.0
    """Validation temperature; 0 is greedy."""
    micro_batch_size: int = 0
    """Rows per generate call; 0 generates the whole batch at once."""
    share_prompts: bool = True
    """A rollout that prefills its prompts itself (`hf`): each distinct prompt of a generate call is
    prefilled once and its KV cache copied to the rows that repeat it (an engine with its own prefix cache
    needs no key)."""
    settings: Any = _settings()
    """The selected rollout's own settings, written as [rollout.<name>] (see `component_settings`)."""


@attrs.define
class WorkerConfig:
    name: str = "debug"
    """A registered training backend (`nanoverl-train plugins` lists them)."""
    settings: Any = _settings()
    """The selected worker's own settings, written as [worker.<name>]."""


@attrs.define
class OptimConfig:
    lr: float = 1e-5
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list[float] = attrs.Factory(lambda: [0.9, 0.999])
    """AdamW betas."""
    warmup_steps: int = 0
    """Linear warm-up from 0 over this many optimizer steps."""
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Schedule after warm-up (decays to min_lr_ratio * lr at the run's last optimizer step)."""
    min_lr_ratio: float = 0.0
    """Floor of the cosine / linear decay as a fraction of lr."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 disables)."""


@attrs.define
class ActorConfig(OptimConfig):
    ppo_epochs: int = 1
    """Passes over each step's rollouts."""
    mini_batch_size: int = 0
    """Prompts per optimizer step (with their n samples); 0 = data.batch_size (one update per epoch)."""
    micro_batch_size: int = 0
    """Rows per forward/backward (gradient accumulation); 0 = the whole mini-batch."""
    max_tokens_per_micro_batch: int = 0
    """Instead of micro_batch_size: rows grouped by length into micro-batches of at most this many
    (padded) tokens, for the update and the log-prob passes; 0 = off."""
    clip_ratio_low: float = 0.2
    """PPO ratio clip below 1 (ratio >= 1 - clip_ratio_low)."""
    clip_ratio_high: float = 0.2
    """PPO ratio clip above 1 (clip-higher uses e.g. 0.28)."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages (> 1); the loss is capped at -A * clip_ratio_c."""
    policy_loss: str = "vanilla"
    """A registered policy loss: "vanilla" (token-level PPO ratio), "gspo" (sequence-level ratio), or a plugin's."""
    loss_agg_mode: LossAggMode = "token-mean"
    """How token losses become one number (README lists when to use each)."""
    loss_scale_factor: float = 0.0
    """seq-mean-token-sum-norm divisor; 0 uses the response length budget (rollout.max_new_tokens)."""
    entropy_coeff: float = 0.0
    """Entropy bonus coefficient (the loss subtracts entropy_coeff * entropy)."""
    use_kl_loss: bool = False
    """Add a KL(pi || ref) loss term (needs reference.enable)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss term."""
    kl_loss_type: KLEstimator = "low_var_kl"
    """KL estimator of the loss term: k1, abs, k2, k3 (= low_var_kl); a "+" suffix keeps the value but
    takes the k2 gradient (straight-through)."""
    log_ratio_clamp: float = 20.0
    """The log-ratio is clamped to +-this before exp so the ratio cannot overflow."""
    logits_chunk_size: int = 1024
    """Response positions per chunk through the LM head: log-probs and entropy from the hidden states, never
    the whole (positions, vocabulary) logits (transformers models with a linear head); 0 = the full logits."""
    share_prompts: bool = True
    """Each distinct prompt of a micro-batch runs through the model once and its KV cache serves every row
    that repeats it (the n samples of a prompt): the same log-probs and gradients to float rounding, for
    about half the work at ~40-token prompts and 32-token responses. Off (or, by itself, under gradient
    checkpointing or for a model without a KV cache): every row runs its whole sequence."""
    settings: Any = _settings()
    """The selected policy loss's own settings, written as [actor.<policy_loss>]."""


@attrs.define
class CriticConfig(OptimConfig):
    enable: bool = False
    """Train a value model (PPO with GAE); every other critic key needs this on."""
    ppo_epochs: int = 1
    """Passes over each step's rollouts for the critic."""
    mini_batch_size: int = 0
    """Prompts per critic optimizer step; 0 = data.batch_size."""
    micro_batch_size: int = 0
    """Rows per critic forward/backward; 0 = the whole mini-batch."""
    max_tokens_per_micro_batch: int = 0
    """Instead of micro_batch_size: critic micro-batches of at most this many (padded) tokens; 0 = off."""
    share_prompts: bool = True
    """As actor.share_prompts, for the value passes and the critic update."""
    cliprange_value: float = 0.5
    """Value clipping around the old values (PPO-style)."""
    loss_agg_mode: LossAggMode = "token-mean"
    """Aggregation of the value loss."""


@attrs.define
class ReferenceConfig:
    enable: bool = False
    """Keep a frozen copy of the initial policy for KL (in the reward or as a loss)."""


Level = Literal["off", "token", "sequence", "geometric"]


@attrs.define
class RolloutCorrectionConfig:
    """Rollout-trainer mismatch correction (algos/rollout_correction.py has verl's and TRL's names)."""

    is_level: Level = "off"
    """Importance weights pi_train / pi_rollout on the policy loss: per token (TIS), per sequence
    (product) or its geometric mean; needs a rollout that returns its log-probs."""
    is_threshold: float = 2.0
    """Upper bound C of the importance weights: min(w, C) (truncation)."""
    is_threshold_low: float | None = None
    """Set a lower bound L to zero weights outside [L, C] instead of truncating (IcePop / masked IS)."""
    is_batch_normalize: bool = False
    """Divide the weights by their batch mean."""
    rs_level: Level = "off"
    """Rejection: drop tokens (or whole sequences) whose ratio leaves [rs_threshold_low, rs_threshold_high]."""
    rs_threshold_high: float = 2.0
    """Upper bound of the rejection band (on pi_train / pi_rollout)."""
    rs_threshold_low: float | None = None
    """Lower bound of the rejection band; unset: 1 / rs_threshold_high."""
    rs_kl: Literal["off", "token_k2", "token_k3", "seq_sum_k2", "seq_sum_k3", "seq_mean_k2", "seq_mean_k3",
                   "seq_max_k2", "seq_max_k3"] = "off"
    """Also drop tokens / sequences whose k2 or k3 KL estimate (per token, or its sum / mean / max) exceeds rs_kl_threshold."""
    rs_kl_threshold: float = 0.0
    """Threshold of rs_kl (positive when rs_kl is on)."""

    @property
    def enabled(self) -> bool:
        return (self.is_level, self.rs_level, self.rs_kl) != ("off", "off", "off")


@attrs.define
class AlgorithmConfig:
    advantage_estimator: str = "gae"
    """A registered advantage estimator (`nanoverl-train plugins` lists them; the core has gae and reinforce_plus_plus)."""
    gamma: float = 1.0
    """Discount factor."""
    lam: float = 1.0
    """GAE lambda."""
    whiten_advantages: bool = False
    """GAE: normalise advantages to zero mean / unit variance over valid tokens."""
    filter_groups: bool = False
    """Drop groups whose rewards are all equal before the update (they carry no signal)."""
    mask_truncated: bool = False
    """DAPO overlong filtering (TRL mask_truncated_completions): responses cut at rollout.max_new_tokens
    without EOS are masked out of the loss; their scores still count in group baselines."""
    use_kl_in_reward: bool = False
    """Subtract kl_coef * KL(pi_old || ref) from the token-level reward (needs reference.enable)."""
    kl_penalty: KLEstimator = "k1"
    """KL estimator used in the reward."""
    kl_ctrl: Literal["fixed", "adaptive"] = "fixed"
    """Fixed kl_coef, or the adaptive controller of Ziegler et al. steering to target_kl."""
    kl_coef: float = 0.001
    """Initial / fixed coefficient of the in-reward KL penalty."""
    target_kl: float = 0.1
    """Adaptive controller: the KL it steers toward."""
    kl_horizon: int = 10000
    """Adaptive controller: horizon (in samples) of its proportional update."""
    rollout_correction: RolloutCorrectionConfig = attrs.Factory(RolloutCorrectionConfig)
    """Importance weights and rejection for the rollout's own log-probs (off by default)."""
    settings: Any = _settings()
    """The selected estimator's own settings, written as [algorithm.<advantage_estimator>]."""


@attrs.define
class RewardComponent:
    """One of several rewards ([[reward.components]]); the score is the weighted sum of the components."""

    name: str = ""
    """A registered reward; with `file`, only the component's label (default: the file's stem)."""
    file: str = ""
    """A .py file defining this component (runs its code; a warning says so)."""
    function: str = "compute_score"
    """Function name inside `file`."""
    weight: float = 1.0
    """This component's weight in the score (negative for a penalty)."""

    @property
    def label(self) -> str:
        """The name in metrics: reward/<label>/mean."""
        return self.name or Path(self.file).stem


@attrs.define
class RewardConfig:
    name: str = "exact_match"
    """A registered reward function (`nanoverl-train plugins` lists them)."""
    file: str = ""
    """Optional path to a .py file defining the reward (runs its code; a warning says so); a verl-style
    `compute_score(data_source, solution_str, ground_truth, extra_info)` runs unchanged."""
    function: str = "compute_score"
    """Function name inside `file`."""
    components: list[RewardComponent] = attrs.Factory(list)
    """Several rewards with weights, instead of name / file: [[reward.components]] tables of name or
    file (+ function) and weight; each logged as reward/<name>/mean, the weighted sum is the score."""
    workers: int = 4
    """Worker processes that score in parallel (a crash or hang there never touches the trainer);
    0 scores in the trainer process (for debugging: timeouts then hold only in the main thread)."""
    timeout_s: float = 0.0
    """Per-call time limit in seconds (0: none). A call that runs over is an error (its worker is killed)."""
    memory_limit_mb: int = 0
    """Address-space limit of each worker process (RLIMIT_AS) in MiB, so a leaking reward fails with
    MemoryError or dies instead of exhausting the machine; 0: no limit."""
    on_error: Literal["raise", "zero"] = "raise"
    """A call that raises, hangs, returns a non-number or kills its worker: "raise" stops (exit 2,
    naming the row), "zero" scores it 0, counts it in reward/errors (reward/timeouts, reward/crashes)
    and continues. Either way the row goes to reward_errors.jsonl in the run directory."""
    overlong_buffer_len: int = 0
    """DAPO soft overlong punishment: a response longer than rollout.max_new_tokens - this many tokens
    loses up to overlong_penalty_factor, linearly over the buffer (verl overlong_buffer.len); 0: off.
    Training scores only: validation measures the task."""
    overlong_penalty_factor: float = 1.0
    """The penalty at rollout.max_new_tokens (verl overlong_buffer.penalty_factor)."""
    pass_threshold: float = 1.0
    """Validation pass@k: a sample passes when its score is at least this."""
    settings: Any = _settings()
    """The selected reward's own settings, written as [reward.<name>] (with components: a dict by name)."""


@attrs.define
class TrackingConfig:
    trackers: list[str] = attrs.Factory(lambda: ["console", "jsonl", "plot"])
    """Registered trackers: console, jsonl (metrics.jsonl), plot (metrics.png), mlflow (a tracking store)."""
    experiment: str = "nanoverl"
    """Experiment name (MLflow)."""
    mlflow_uri: str = ""
    """Empty: $MLFLOW_TRACKING_URI if set, else the embedded local store (sqlite next to the runs)."""
    run_name: str = ""
    """Run name; empty uses the run directory's name."""
    settings: dict[str, Any] = attrs.field(factory=dict, init=False)
    """Each selected tracker's own settings by tracker name, written as [tracking.<name>]."""


@attrs.define
class Config:
    trainer: TrainerConfig = attrs.Factory(TrainerConfig)
    data: DataConfig = attrs.Factory(DataConfig)
    model: ModelConfig = attrs.Factory(ModelConfig)
    rollout: RolloutConfig = attrs.Factory(RolloutConfig)
    worker: WorkerConfig = attrs.Factory(WorkerConfig)
    actor: ActorConfig = attrs.Factory(lambda: ActorConfig(lr=1e-6))
    critic: CriticConfig = attrs.Factory(CriticConfig)
    reference: ReferenceConfig = attrs.Factory(ReferenceConfig)
    algorithm: AlgorithmConfig = attrs.Factory(AlgorithmConfig)
    reward: RewardConfig = attrs.Factory(RewardConfig)
    tracking: TrackingConfig = attrs.Factory(TrackingConfig)

    # ---- derived values ------------------------------------------------------------------------
    @property
    def actor_mini_batch_size(self) -> int:
        """Prompts per actor optimizer step."""
        return self.actor.mini_batch_size or self.data.batch_size

    @property
    def critic_mini_batch_size(self) -> int:
        return self.critic.mini_batch_size or self.data.batch_size

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data, each component's settings as its [<section>.<name>] table, so
        `load_config` of the result gives this config back."""
        data = _converter.unstructure(self)
        for section in COMPONENTS:
            for name, settings in _settings_by_name(self, section).items():
                if settings is not None:
                    data[section][name] = _converter.unstructure(settings)
        return data

    def validate(self) -> "Config":
        """Reject impossible combinations before anything heavy loads."""
        t, d, r, a, c, alg = self.trainer, self.data, self.rollout, self.actor, self.critic, self.algorithm
        positive = {"trainer.total_steps": t.total_steps, "data.batch_size": d.batch_size,
                    "data.val_batch_size": d.val_batch_size, "data.max_prompt_length": d.max_prompt_length,
                    "rollout.n": r.n, "rollout.val_n": r.val_n, "rollout.max_new_tokens": r.max_new_tokens,
                    "actor.ppo_epochs": a.ppo_epochs, "critic.ppo_epochs": c.ppo_epochs}
        for key, value in positive.items():
            if value < 1:
                raise ConfigError(f"{key} = {value} must be at least 1")
        nonneg = {"trainer.save_every": t.save_every, "trainer.val_every": t.val_every,
                  "trainer.critic_warmup": t.critic_warmup, "actor.mini_batch_size": a.mini_batch_size,
                  "actor.micro_batch_size": a.micro_batch_size, "critic.mini_batch_size": c.mini_batch_size,
                  "critic.micro_batch_size": c.micro_batch_size, "rollout.top_k": r.top_k,
                  "actor.lr": a.lr, "critic.lr": c.lr, "rollout.temperature": r.temperature,
                  "rollout.val_temperature": r.val_temperature, "reward.timeout_s": self.reward.timeout_s,
                  "trainer.num_threads": t.num_threads, "actor.max_tokens_per_micro_batch": a.max_tokens_per_micro_batch,
                  "actor.logits_chunk_size": a.logits_chunk_size,
                  "critic.max_tokens_per_micro_batch": c.max_tokens_per_micro_batch}
        for key, value in nonneg.items():
            if value < 0:
                raise ConfigError(f"{key} = {value} must not be negative")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", t.device):
            raise ConfigError(f"trainer.device = {t.device!r} is not a supported device; use auto, cpu, cuda or cuda:N")
        if t.keep_checkpoints < 1:
            raise ConfigError(f"trainer.keep_checkpoints = {t.keep_checkpoints} must be at least 1 "
                              "(a resumable run needs its newest checkpoint)")
        if not 0 < r.top_p <= 1:
            raise ConfigError(f"rollout.top_p = {r.top_p} must be in (0, 1]")
        if r.temperature == 0:
            raise ConfigError("rollout.temperature = 0 is greedy, which gives every sample of a prompt the same "
                              "response; use a positive temperature for training (val_temperature may be 0)")
        for section, part in (("actor", a), ("critic", c)):
            if part.micro_batch_size and part.max_tokens_per_micro_batch:
                raise ConfigError(f"{section}.micro_batch_size and {section}.max_tokens_per_micro_batch are both set; "
                                  "set one: a row count or a token budget per micro-batch")
        for section, mini, micro in (("actor", self.actor_mini_batch_size, a.micro_batch_size),
                                     ("critic", self.critic_mini_batch_size, c.micro_batch_size)):
            if d.batch_size % mini:
                raise ConfigError(f"{section}.mini_batch_size = {mini} must divide data.batch_size = {d.batch_size}")
            if micro and (mini * r.n) % micro:
                raise ConfigError(f"{section}.micro_batch_size = {micro} must divide the mini-batch's rows "
                                  f"({section}.mini_batch_size * rollout.n = {mini * r.n})")
        if a.clip_ratio_c <= 1:
            raise ConfigError(f"actor.clip_ratio_c = {a.clip_ratio_c} must be greater than 1 (dual-clip bound)")
        if not c.enable:
            changed = _changed_fields(c, CriticConfig(), ignore={"enable"})
            if changed:
                raise ConfigError(f"critic.{changed[0]} is set but critic.enable = false; "
                                  "set critic.enable = true or remove the critic keys")
        needs_ref = [k for k, on in (("actor.use_kl_loss", a.use_kl_loss),
                                     ("algorithm.use_kl_in_reward", alg.use_kl_in_reward)) if on]
        if needs_ref and not self.reference.enable:
            raise ConfigError(f"{needs_ref[0]} = true needs a reference policy; set reference.enable = true")
        rc = alg.rollout_correction
        if rc.is_threshold <= 0 or (rc.is_threshold_low is not None and not 0 <= rc.is_threshold_low <= rc.is_threshold):
            raise ConfigError("algorithm.rollout_correction.is_threshold must be positive and is_threshold_low, if set, "
                              f"in [0, is_threshold]; got {rc.is_threshold} and {rc.is_threshold_low}")
        if rc.rs_threshold_high <= 0 or (rc.rs_threshold_low is not None
                                         and not 0 < rc.rs_threshold_low <= rc.rs_threshold_high):
            raise ConfigError("algorithm.rollout_correction.rs_threshold_high must be positive and rs_threshold_low, "
                              f"if set, in (0, rs_threshold_high]; got {rc.rs_threshold_high} and {rc.rs_threshold_low}")
        if rc.rs_kl != "off" and rc.rs_kl_threshold <= 0:
            raise ConfigError(f"algorithm.rollout_correction.rs_kl = {rc.rs_kl!r} needs a positive rs_kl_threshold")
        if not 0 <= alg.gamma <= 1 or not 0 <= alg.lam <= 1:
            raise ConfigError("algorithm.gamma and algorithm.lam must be in [0, 1]")
        self._validate_lora()
        self._validate_reward()
        if not self.data.train_files:
            raise ConfigError("data.train_files is empty; name at least one jsonl / json / parquet file")
        if t.eval_before_after and not d.val_files:
            raise ConfigError("trainer.eval_before_after = true evaluates on data.val_files, which is empty; "
                              "name a validation file or set trainer.eval_before_after = false")
        return self

    def _validate_reward(self) -> None:
        rw = self.reward
        for key in ("workers", "memory_limit_mb", "overlong_buffer_len"):
            if getattr(rw, key) < 0:
                raise ConfigError(f"reward.{key} = {getattr(rw, key)} must not be negative")
        if rw.overlong_buffer_len > self.rollout.max_new_tokens:
            raise ConfigError(f"reward.overlong_buffer_len = {rw.overlong_buffer_len} must not exceed "
                              f"rollout.max_new_tokens = {self.rollout.max_new_tokens}")
        if rw.overlong_penalty_factor < 0:
            raise ConfigError(f"reward.overlong_penalty_factor = {rw.overlong_penalty_factor} must not be negative")
        if not rw.components:
            return
        set_too = [k for k in ("name", "file", "function") if getattr(rw, k) != getattr(RewardConfig(), k)]
        if set_too:
            raise ConfigError(f"reward.{set_too[0]} is set next to [[reward.components]]; name each reward in a "
                              "component (name or file, and weight) and remove reward.name / reward.file")
        labels = set()
        for i, comp in enumerate(rw.components):
            key = f"reward.components[{i}]"
            if not comp.name and not comp.file:
                raise ConfigError(f"{key} names no reward; set its name (a registered reward) or file")
            if not math.isfinite(comp.weight):
                raise ConfigError(f"{key}.weight = {comp.weight} must be a finite number")
            if comp.label in labels:
                raise ConfigError(f"{key}: two components are called {comp.label!r}; give one a different name "
                                  "(with a file, name is only its label)")
            labels.add(comp.label)

    def _validate_lora(self) -> None:
        lora = self.model.lora
        if not lora.enable:
            changed = _changed_fields(lora, LoraConfig(), ignore={"enable"})
            if changed:
                raise ConfigError(f"model.lora.{changed[0]} is set but model.lora.enable = false; "
                                  "set model.lora.enable = true or remove the model.lora keys")
            return
        if lora.rank < 1:
            raise ConfigError(f"model.lora.rank = {lora.rank} must be at least 1 (typical: 8 to 64)")
        if lora.alpha <= 0:
            raise ConfigError(f"model.lora.alpha = {lora.alpha} must be positive (typical: 2 * rank)")
        if not 0 <= lora.dropout < 1:
            raise ConfigError(f"model.lora.dropout = {lora.dropout} must be in [0, 1)")
        targets = lora.target_modules
        if isinstance(targets, str) and targets != "all-linear" or isinstance(targets, list) and (
                not targets or "all-linear" in targets):
            raise ConfigError(f"model.lora.target_modules = {targets!r} must be \"all-linear\" or a non-empty list of "
                              "module names, e.g. [\"q_proj\", \"v_proj\"]")


def _changed_fields(obj: Any, default: Any, ignore: set[str]) -> list[str]:
    return [f.name for f in attrs.fields(type(obj))
            if f.name not in ignore and getattr(obj, f.name) != getattr(default, f.name)]


# ---- loading --------------------------------------------------------------------------------------
_converter = cattrs.Converter(forbid_extra_keys=True)


def _read_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; check the --config path")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(f"config file {path} must end in .toml, .yaml, .yml or .json")
    except (tomllib.TOMLDecodeError, yaml.YAMLError, json.JSONDecodeError) as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError(f"config file {path} cannot be parsed: {detail}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(data).__name__}")
    return data


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _parse_value(text: str) -> Any:
    """An override value: JSON / YAML scalars and lists (`20`, `true`, `[console, jsonl]`), else a string."""
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def _field_type(parts: list[str]) -> Any:
    """The declared type at a dotted path, or None if the path is not in the schema."""
    cls: Any = Config
    for part in parts:
        if not (isinstance(cls, type) and attrs.has(cls)):
            return None
        field = attrs.fields_dict(cls).get(part)
        if field is None:
            return None
        cls = field.type
    return cls


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one `section.key=value` override. Values are parsed as YAML scalars or lists, except
    for string keys, which take the text as written (`trainer.output_dir=runs/007`)."""
    key, sep, value = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {override!r} must look like section.key=value")
    parts = key.strip().split(".")
    ftype = _field_type(parts)
    is_text = ftype is str or (get_origin(ftype) is Literal and all(isinstance(a, str) for a in get_args(ftype)))
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {part} is a value, not a section")
        node = child
    if is_text:
        node[parts[-1]] = value
    elif ftype is float:
        try:
            node[parts[-1]] = float(value)  # YAML would read 1e-3 as a string
        except ValueError:
            node[parts[-1]] = value  # reported as a type error with the key path
    else:
        parsed = _parse_value(value)
        if isinstance(parsed, str) and _FLOAT.fullmatch(parsed.strip()):
            parsed = float(parsed)  # YAML reads 1e-3 as text (an optional float, a component setting)
        node[parts[-1]] = parsed


def _user_fields(cls: type) -> dict[str, attrs.Attribute]:
    """The keys a user may write in a section (component settings live in their own tables)."""
    return {f.name: f for f in attrs.fields(cls) if f.init}


def _known_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    for field in _user_fields(cls).values():
        path = f"{prefix}{field.name}"
        keys.append(path)
        if attrs.has(field.type if isinstance(field.type, type) else object):
            keys += _known_keys(field.type, path + ".")
    return keys


def _check_keys(data: dict[str, Any], cls: type, prefix: str = "", extra: tuple[str, ...] = ()) -> None:
    """Unknown keys, reported with their full path and the closest known key (`extra`: more valid paths)."""
    fields = _user_fields(cls)
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in fields:
            known = [f"{prefix}{name}" for name in fields] + list(extra)
            close = difflib.get_close_matches(path, known, n=1, cutoff=0.6) or \
                difflib.get_close_matches(path, [*_known_keys(Config), *extra], n=1, cutoff=0.6) or \
                difflib.get_close_matches(path, known, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys here: {', '.join(known)}"
            raise ConfigError(f"unknown config key {path!r}{hint}")
        ftype = fields[key].type
        if isinstance(ftype, type) and attrs.has(ftype):
            if not isinstance(value, dict):
                raise ConfigError(f"config key {path!r} is a section; write it as a table of keys, not {value!r}")
            _check_keys(value, ftype, path + ".")
        (item,) = get_args(ftype) if get_origin(ftype) is list else (None,)
        if isinstance(item, type) and attrs.has(item) and isinstance(value, list):  # [[reward.components]]
            for i, entry in enumerate(value):
                if isinstance(entry, dict):
                    _check_keys(entry, item, f"{path}[{i}].")


def _leaf_message(exc: BaseException, kind: Any) -> str:
    """A validator's own message (attrs names the field and the bound), else cattrs' default."""
    if isinstance(exc, ValueError) and str(exc):
        return str(exc)
    return cattrs.v.format_exception(exc, kind)


def _structure(data: dict[str, Any], cls: type, prefix: str = "") -> Any:
    """cattrs structuring with the first error as one line: 'config key <path>: <what is wrong>'.
    Field validators (a component's settings may declare them) run after, each reported by its key."""
    try:
        with attrs.validators.disabled():
            obj = _converter.structure(data, cls)
        for field in attrs.fields(cls):
            if field.validator is not None:
                try:
                    field.validator(obj, field, getattr(obj, field.name))
                except (ValueError, TypeError) as exc:
                    raise ConfigError(f"config key {prefix + field.name!r}: {exc}; fix the value in the config "
                                      "or override") from None
        return obj
    except ConfigError:
        raise
    except Exception as exc:  # cattrs wraps every leaf error in a ClassValidationError
        for message in cattrs.transform_error(exc, path="$", format_exception=_leaf_message):
            text, _, where = message.partition(" @ ")
            where = prefix + where.removeprefix("$.").replace("$", "")
            raise ConfigError(f"config key {where.rstrip('.')!r}: {text}; fix the value in the config "
                              "or override") from None
        raise ConfigError(f"config section {prefix.rstrip('.') or 'root'}: {exc}") from None


# ---- component settings ---------------------------------------------------------------------------
COMPONENTS: dict[str, str] = {"rollout": "rollout", "worker": "worker", "actor": "policy_loss",
                              "algorithm": "advantage_estimator", "reward": "reward", "tracking": "tracker"}
"""Config section -> the registry kind of the component(s) it selects. A component that registered a
settings class (`register(..., settings=Cls)`) is configured in the table [<section>.<name>]; the
selected one's settings object is `config.<section>.settings` (for trackers, a dict by name)."""


def _selected(config: Config, section: str) -> list[str]:
    return {"rollout": [config.rollout.name], "worker": [config.worker.name], "actor": [config.actor.policy_loss],
            "algorithm": [config.algorithm.advantage_estimator],
            "reward": [c.name for c in config.reward.components if not c.file] if config.reward.components
            else [] if config.reward.file else [config.reward.name],
            "tracking": list(config.tracking.trackers)}[section]


def _keyed_by_name(config: Config, section: str) -> bool:
    """Sections that select several components hold their settings as a dict by name."""
    return section == "tracking" or (section == "reward" and bool(config.reward.components))


def _settings_by_name(config: Config, section: str) -> dict[str, Any]:
    node = getattr(config, section)
    if _keyed_by_name(config, section):
        return dict(node.settings or {})
    names = _selected(config, section)
    return {names[0]: node.settings} if names else {}


def _pop_component_tables(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Take every [<section>.<name>] table that is not a core key of its section out of `data`."""
    tables: dict[str, dict[str, Any]] = {}
    for section in COMPONENTS:
        node = data.get(section)
        if not isinstance(node, dict):
            continue
        core = _user_fields(attrs.fields_dict(Config)[section].type)
        for key in [k for k, v in node.items() if isinstance(v, dict) and k not in core]:
            tables.setdefault(section, {})[key] = node.pop(key)
    return tables


def component_settings(config: Config, registry, tables: dict[str, dict[str, Any]] | None = None) -> Config:
    """Give every selected component its typed settings, validated like the core's keys.

    `tables` are the [<section>.<name>] tables of the config file and overrides. A component whose
    settings are already set (a loaded config) keeps them unless a table is given. Tables for a
    registered component that is not selected are ignored with a warning (switching `rollout.name`
    by an override must not break on the other rollout's settings); a table naming no registered
    component is an unknown key. Names that are not registered at all are left for
    `resolve_plugins` to report with the close match and the install line.
    """
    tables = tables or {}
    for section, kind in COMPONENTS.items():
        given, node = dict(tables.get(section, {})), getattr(config, section)
        if _keyed_by_name(config, section) and not isinstance(node.settings, dict):
            node.settings = {}
        for name in _selected(config, section):
            if name not in registry.entries[kind]:
                continue
            cls, table, key = registry.settings_class(kind, name), given.pop(name, None), f"{section}.{name}"
            current = node.settings.get(name) if _keyed_by_name(config, section) else node.settings
            if cls is None and table:
                raise ConfigError(f"[{key}] is set, but the {kind} {name!r} takes no settings; remove that table")
            if cls is None:
                value = None
            elif table is None and isinstance(current, cls):
                value = current
            else:
                _check_keys(table or {}, cls, key + ".")
                value = _structure(table or {}, cls, key + ".")
            if _keyed_by_name(config, section):
                node.settings[name] = value
            else:
                node.settings = value
        for name in given:
            if name in registry.entries[kind]:
                print(f"warning: [{section}.{name}] is ignored: that {kind} is not selected", file=sys.stderr)
                continue
            _check_keys({name: given[name]}, attrs.fields_dict(Config)[section].type, f"{section}.",
                        extra=tuple(f"{section}.{n}" for n in registry.names(kind)))
    return config


# ---- loading --------------------------------------------------------------------------------------
def _drop_disabled_parts(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> None:
    """An override that switches a part off (`critic.enable=false`) wins over the file's keys for that
    part: they are dropped with a warning. Keys the overrides themselves set still conflict."""
    from_overrides = {o.partition("=")[0].strip() for o in overrides}
    for part in ("critic", "reference"):
        node = data.get(part)
        if f"{part}.enable" not in from_overrides or not isinstance(node, dict) or node.get("enable") is not False:
            continue
        ignored = sorted(k for k in node if k != "enable" and f"{part}.{k}" not in from_overrides)
        for key in ignored:
            del node[key]
        if ignored:
            print(f"warning: {part}.enable=false: ignoring {', '.join(f'{part}.{k}' for k in ignored)} "
                  "set in the config file", file=sys.stderr)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), *,
                registry=None) -> Config:
    """Read a TOML / YAML / JSON config, apply dotted overrides, structure and validate it, and give
    each selected component its settings (`registry`: the installed plugins, discovered if None)."""
    return config_from_dict(_read_file(Path(path)) if path else {}, overrides, registry=registry)


def config_from_dict(data: dict[str, Any], overrides: list[str] | tuple[str, ...] = (), *, registry=None) -> Config:
    """`load_config` of an already parsed mapping (a run's config.json holds one under "config")."""
    data = json.loads(json.dumps(data))  # a private copy: overrides and table extraction edit it
    for override in overrides:
        apply_override(data, override)
    _drop_disabled_parts(data, overrides)
    tables = _pop_component_tables(data)
    _check_keys(data, Config)
    config = _structure(data, Config).validate()
    if registry is None:
        from ..plugins import load_registry
        registry = load_registry()
    return component_settings(config, registry, tables)


# cattrs accepts 1 for a bool and "3" for an int; a config typo should not pass silently.
def _strict(kind: type):
    def structure(value: Any, _: type) -> Any:
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not ok:
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
        return value
    return structure


for _kind in (bool, int, float, str):
    _converter.register_structure_hook(_kind, _strict(_kind))


# cattrs turns a string into a list of its characters: `train_files = "a.jsonl"` would read ["a", ".", ...].
def _strict_list(value: Any, kind: Any) -> list:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"expected a list, got {type(value).__name__} {value!r}")
    (item,) = get_args(kind) or (Any,)
    return [_converter.structure(v, item) for v in value]


_converter.register_structure_hook_func(lambda t: get_origin(t) is list, _strict_list)


def _target_modules(value: Any, _: Any) -> str | list[str]:
    if isinstance(value, str) or isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise ValueError(f"expected \"all-linear\" or a list of module names, got {type(value).__name__} {value!r}")


_converter.register_structure_hook(TargetModules, _target_modules)
