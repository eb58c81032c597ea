"""The typed config tree: one attrs class per section, one docstring per field, every default at its field.

Files are TOML, YAML or JSON (load.py); structuring forbids unknown keys and reports a typo with its key
path and the closest valid key (structure.py); cross-field rules (batch sizes that divide, a critic
setting with the critic off, ...) run in ``Config.validate`` before any model loads (rules.py).

Over 400 lines on purpose: every key a user can write is declared here, in the order of a config file,
so "what does this key do and what is its default" has one place to look.
"""

from pathlib import Path
from typing import Any, Literal, get_args

import attrs

from .components import COMPONENTS, settings_by_name
from .domains import (above, at_least, between, data_files, finite, folder, model_source, python_file,
                      teacher_folder, teacher_source)
from .rules import check_config
from .structure import converter

LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                      "seq-mean-token-sum-norm"]
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)
"""How token losses become one number (`algos.agg_loss` computes each); the one list of these names."""

KL_ESTIMATORS = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
"""The per-token KL estimators `algos.kl_penalty` computes (kl = k1, mse = k2, low_var_kl = k3); the one
list of these names."""
KLEstimator = Literal[KL_ESTIMATORS + tuple(f"{name}+" for name in KL_ESTIMATORS)]
"""An estimator, or one with a "+" suffix: its value with the k2 gradient (straight-through)."""


Pack = Literal["auto", True, False]
"""actor.pack / critic.pack: "auto" (where the model supports it), true (required) or false."""


def _structure_pack(value: Any, _: Any) -> bool | str:
    if value is True or value is False or value == "auto":      # not 1 or 0: a bool is written true / false
        return value
    raise TypeError(f'expected true, false or "auto", got {value!r}')


converter.register_structure_hook_func(lambda kind: kind == Pack, _structure_pack)

DType = Literal["float32", "bfloat16", "float16"]
"""A parameter dtype (model.dtype, and the plugins' settings that take one)."""


def _betas(instance: Any, attribute: attrs.Attribute, value: list[float]) -> None:
    if len(value) != 2 or not all(between(0, 1, high_open=True).contains(b) for b in value):
        raise ValueError(f"{value!r} is not two numbers in [0, 1) (AdamW's beta1, beta2)")


def _settings(**kwargs):
    """A component's typed settings: not a key the user writes under this name (see `component_settings`)."""
    return attrs.field(default=None, init=False, **kwargs)


@attrs.define
class TrainerConfig:
    total_epochs: int = attrs.field(default=0, validator=at_least(0))
    """Passes over the training rows, instead of total_steps (0: unused): the run takes total_epochs *
    (training rows // data.batch_size) steps, counted once the data is loaded (after
    data.max_prompt_length drops prompts); a generated source's rows are [data.<source>] size."""
    total_steps: int | None = attrs.field(validator=at_least(1, optional=True))
    """Trainer steps (one rollout batch and one policy update each); 100 when neither it nor total_epochs
    is set, None until the data is loaded when total_epochs is."""

    @total_steps.default
    def _total_steps_default(self) -> int | None:
        return None if self.total_epochs else 100
    seed: int = attrs.field(default=0, validator=between(0, 2**32 - 1))
    """Seeds python, numpy and torch; every run with the same seed and config is identical on CPU."""
    output_dir: str = attrs.field(default="runs/demo", validator=folder)
    """The run directory: config.json, metrics.jsonl, rollouts/, checkpoints/."""
    save_every: int = attrs.field(default=50, validator=at_least(0))
    """Checkpoint period in steps; 0 saves only at the end."""
    val_every: int = attrs.field(default=25, validator=at_least(0))
    """Validation period in steps; 0 never validates."""
    val_before_train: bool = False
    """Validate once before the first step (logged as step 0)."""
    eval_before_after: bool = False
    """Evaluate on data.val_files before the first step and after the last, greedy and sampled
    (the `nanoverl-train eval` table): printed, and written to eval.json in the run directory."""
    resume: str = "auto"
    """"auto" (newest complete checkpoint in output_dir), "never", or a checkpoint folder path."""
    keep_checkpoints: int = attrs.field(default=2, validator=at_least(1))
    """How many complete checkpoints to keep; older ones are deleted after a successful save."""
    critic_warmup: int = attrs.field(default=0, validator=at_least(0))
    """Steps during which only the critic is updated (the actor waits)."""
    rollout_samples: int = attrs.field(default=8, validator=at_least(-1))
    """Samples per step written to rollouts/step_<N>.jsonl; 0 writes none, -1 writes all."""
    device: str = "auto"
    """"auto" (cuda if available), "cpu", or "cuda" / "cuda:N"."""
    num_threads: int = attrs.field(default=0, validator=at_least(0))
    """torch intra-op threads; 0 keeps torch's default. One thread is often fastest for tiny models."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """A NaN/inf loss or gradient: "stop" ends the run (exit 2, last checkpoint kept), "skip" drops the update."""
    progress: Literal["auto", "bar", "log", "none"] = "auto"
    """Progress display: a bar on an interactive terminal, plain log lines otherwise."""


@attrs.define
class DataConfig:
    source: str = "files"
    """Where the prompts come from: a registered data source (`nanoverl-train plugins` lists them); "files"
    reads train_files and val_files, a generator (e.g. reasoning_gym) draws rows from its [data.<source>]
    settings."""
    train_files: list[str] = attrs.field(factory=list, validator=data_files)
    """jsonl / json / parquet files of training prompts, loaded with `datasets` (data.source = "files")."""
    val_files: list[str] = attrs.field(factory=list, validator=data_files)
    """Validation files; empty disables validation (data.source = "files")."""
    prompt_key: str = "prompt"
    """Column holding the prompt: a string, or a chat message list rendered with the chat template."""
    data_source_key: str = "data_source"
    """Column used to group validation summaries (val/<source>/reward/mean); missing -> "default"."""
    batch_size: int = attrs.field(default=16, validator=at_least(1))
    """Prompts per step (before sampling n responses each)."""
    val_batch_size: int = attrs.field(default=64, validator=at_least(1))
    """Prompts per validation generate call."""
    val_max_samples: int = attrs.field(default=0, validator=at_least(0))
    """Validate on the first N validation rows only (0: every row), e.g. a slice of a test set too large for
    a CPU (GSM8K's 1,319); verl's key of the same name. Training still skips every validation question of
    a generated source that is validated on, and only those."""
    max_prompt_length: int = attrs.field(default=256, validator=at_least(1))
    """Prompts with more tokens are filtered out at load time (the count is logged)."""
    shuffle: bool = True
    """Reshuffle the training prompts every epoch (seeded by trainer.seed and the epoch)."""
    apply_chat_template: bool = True
    """Render chat-format prompts through the tokenizer's chat template (a tokenizer without one is an
    error); false joins the messages' contents with newlines."""
    settings: Any = _settings()
    """The selected data source's own settings, written as [data.<source>] (see `component_settings`)."""


TargetModules = str | list[str]


@attrs.define
class LoraConfig:
    """[model.lora]: train a low-rank adapter (peft) instead of every weight; needs nanoverl-hf[lora].

    Read by every worker that trains an adapter (a factory with `supports_lora`: nanoverl-hf's and the
    sharded one; any other worker with enable = true is a ConfigError naming those) and by the rollouts
    that sync its weights. A model section, not one worker's table: it describes the model being
    trained whichever backend trains it, which is where verl (`model.lora_rank`) and TRL
    (`ModelConfig.use_peft`, `lora_r`) keep it too."""

    enable: bool = False
    """Train a LoRA adapter on the frozen base model (policy, and the critic with a full value head);
    the reference is the same module with the adapter disabled (no second copy)."""
    rank: int = attrs.field(default=8, validator=at_least(1))
    """Adapter rank r (peft LoraConfig.r): trainable parameters per adapted layer r * (in + out)."""
    alpha: float = attrs.field(default=16.0, validator=above(0))
    """LoRA alpha: the adapter's output is scaled by alpha / rank."""
    dropout: float = attrs.field(default=0.0, validator=between(0, 1, high_open=True))
    """Dropout on the adapter's input in the update's forward (log-prob passes run without it)."""
    target_modules: TargetModules = "all-linear"
    """"all-linear" (every linear layer but the output head) or a list of module names, e.g. ["q_proj", "v_proj"]."""


@attrs.define
class ModelConfig:
    path: str = attrs.field(default="", validator=model_source)
    """A local Hugging Face model folder, or a .gguf file (docs/backends.md); empty for the debug worker."""
    tokenizer_path: str = attrs.field(default="", validator=folder)
    """Tokenizer folder if not the model folder."""
    dtype: DType = "float32"
    """Parameter dtype for training and rollout: of the weights, their gradients and the AdamW state
    (bfloat16 here is a pure-bf16 model; bf16 mixed precision is compute_dtype)."""
    compute_dtype: Literal["", "auto", "float32", "bfloat16", "float16"] = ""
    """Mixed precision. "" (default): compute in model.dtype, no autocast. "bfloat16" / "float16": the
    actor's and critic's forward and backward (update, log-prob, reference and value passes) and a
    rollout sharing their modules run under torch.autocast to it, while weights, gradients and AdamW
    state stay in model.dtype (keep "float32": TRL's bf16 = true, verl's mixed precision); log-softmax,
    entropy and the losses stay float32. An engine with its own copy of the weights holds them in it
    (docs/backends.md#precision). "float16" has no loss scaling here (gradients can underflow): prefer
    "bfloat16". Not wider than model.dtype. "auto": "bfloat16" where the hardware computes in it (a CUDA
    GPU with bf16, a CPU with bf16 matmul instructions: nanoverl_core.workers.precision), else float32;
    the run says which at start and its config.json holds the pick."""
    compile: bool = False
    """torch.compile (Inductor, dynamic shapes) the parts of each transformer block that hold no KV cache
    (a Llama's norms and MLP) in the actor's, reference's and critic's modules, and in a rollout sharing
    them, and the chunked LM head's log-softmax: fused element-wise kernels between the matmuls, the same
    numbers to float rounding. Off by default: the first steps pay the compilation; `perf/compiled_graphs`
    and `perf/compile_s` count it (docs/backends.md#compile)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    trust_remote_code: bool = False
    """Allow model code from the model folder to run (off: only transformers' own classes)."""
    lora: LoraConfig = attrs.Factory(LoraConfig)
    """[model.lora], LoRA through peft for the workers that support it (off by default: full fine-tuning)."""


@attrs.define
class RolloutConfig:
    name: str = "debug"
    """A registered rollout engine (`nanoverl-train plugins` lists them)."""
    n: int = attrs.field(default=1, validator=at_least(1))
    """Responses sampled per prompt; rows sampled from one prompt share a uid."""
    max_new_tokens: int = attrs.field(default=32, validator=at_least(1))
    """Maximum response length; generation stops earlier once every sequence hit EOS."""
    temperature: float = attrs.field(default=1.0, validator=at_least(0))
    """Sampling temperature; log-probs for training use the same temperature."""
    top_p: float = attrs.field(default=1.0, validator=between(0, 1, low_open=True))
    """Nucleus sampling threshold (1.0 disables)."""
    top_k: int = attrs.field(default=0, validator=at_least(0))
    """Top-k sampling (0 disables)."""
    val_n: int = attrs.field(default=1, validator=at_least(1))
    """Samples per validation prompt when val_temperature > 0 (mean@n and best@n are logged; greedy
    validation takes one), and for the sampled row of eval / trainer.eval_before_after."""
    val_temperature: float = attrs.field(default=0.0, validator=at_least(0))
    """Validation temperature; 0 is greedy."""
    micro_batch_size: int = attrs.field(default=0, validator=at_least(0))
    """Rows per generate call; 0 generates the whole batch at once."""
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
    lr: float = attrs.field(default=1e-5, validator=at_least(0))
    """AdamW learning rate: the critic's default (ActorConfig sets the policy's own, 1e-6, at its field)."""
    weight_decay: float = attrs.field(default=0.0, validator=at_least(0))
    """AdamW weight decay."""
    betas: list[float] = attrs.field(factory=lambda: [0.9, 0.999], validator=_betas)
    """AdamW betas."""
    warmup_steps: int = attrs.field(default=0, validator=at_least(0))
    """Linear warm-up from 0 over this many optimizer steps."""
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Schedule after warm-up (decays to min_lr_ratio * lr at the run's last optimizer step)."""
    min_lr_ratio: float = attrs.field(default=0.0, validator=between(0, 1))
    """Floor of the cosine / linear decay as a fraction of lr."""
    grad_clip: float = attrs.field(default=1.0, validator=at_least(0))
    """Clip the global gradient norm to this (0 disables)."""


@attrs.define
class ActorConfig(OptimConfig):
    lr: float = attrs.field(default=1e-6, validator=at_least(0))
    """AdamW learning rate of the policy (the critic's default is 1e-5)."""
    ppo_epochs: int = attrs.field(default=1, validator=at_least(1))
    """Passes over each step's rollouts."""
    mini_batch_size: int = attrs.field(default=0, validator=at_least(0))
    """Prompts per optimizer step (with their n samples); 0 = data.batch_size (one update per epoch)."""
    micro_batch_size: int = attrs.field(default=0, validator=at_least(0))
    """Rows per forward/backward (gradient accumulation); 0 = the whole mini-batch."""
    max_tokens_per_micro_batch: int = attrs.field(default=0, validator=at_least(0))
    """Instead of micro_batch_size: rows grouped by length into micro-batches of at most this many
    tokens (padded: rows x longest; packed, actor.pack: real tokens), for the update and the log-prob
    passes; 0 = off."""
    clip_ratio_low: float = attrs.field(default=0.2, validator=between(0, 1, high_open=True))
    """PPO ratio clip below 1 (ratio >= 1 - clip_ratio_low)."""
    clip_ratio_high: float = attrs.field(default=0.2, validator=at_least(0))
    """PPO ratio clip above 1 (clip-higher uses e.g. 0.28)."""
    clip_ratio_c: float = attrs.field(default=3.0, validator=above(1))
    """Dual-clip bound for negative advantages (> 1); the loss is capped at -A * clip_ratio_c."""
    policy_loss: str = "vanilla"
    """A registered policy loss: "vanilla" (token-level PPO ratio), "gspo" (sequence-level ratio), or a plugin's."""
    loss_agg_mode: LossAggMode = "token-mean"
    """How token losses become one number (docs/algorithms.md lists when to use each)."""
    loss_scale_factor: float = attrs.field(default=0.0, validator=at_least(0))
    """seq-mean-token-sum-norm divisor; 0 uses the response length budget (rollout.max_new_tokens)."""
    entropy_coeff: float = attrs.field(default=0.0, validator=finite())
    """Entropy bonus coefficient (the loss subtracts entropy_coeff * entropy)."""
    use_kl_loss: bool = False
    """Add a KL(pi || ref) loss term (needs reference.enable)."""
    kl_loss_coef: float = attrs.field(default=0.001, validator=at_least(0))
    """Weight of the KL loss term."""
    kl_loss_type: KLEstimator = "low_var_kl"
    """KL estimator of the loss term: k1 (= kl), abs, k2 (= mse), k3 (= low_var_kl); a "+" suffix keeps the
    value but takes the k2 gradient (straight-through)."""
    log_ratio_clamp: float = attrs.field(default=20.0, validator=above(0))
    """The log-ratio is clamped to +-this before exp so the ratio cannot overflow."""
    logits_chunk_size: int = attrs.field(default=1024, validator=at_least(0))
    """Response positions per chunk through the LM head: log-probs and entropy from the hidden states, never
    the whole (positions, vocabulary) logits (transformers models with a linear head); 0 = the full logits."""
    share_prompts: bool = True
    """Each distinct prompt of a micro-batch runs through the model once and its KV cache serves every row
    that repeats it (the n samples of a prompt): the same log-probs and gradients to float rounding, for
    about half the work at ~40-token prompts and 32-token responses. Off (or, by itself, under gradient
    checkpointing or for a model without a KV cache): every row runs its whole sequence."""
    pack: Pack = "auto"
    """Padding-free micro-batches for the update, log-prob and reference passes: rows laid end to end,
    positions restarting per row, attention kept inside each row (docs/algorithms.md#padding-free-micro-batches).
    "auto": where the model's attention supports it; true: or exit 2; false: padded rectangles."""
    settings: Any = _settings()
    """The selected policy loss's own settings, written as [actor.<policy_loss>]."""


@attrs.define
class CriticConfig(OptimConfig):
    enable: bool = False
    """Train a value model (PPO with GAE); every other critic key needs this on."""
    ppo_epochs: int = attrs.field(default=1, validator=at_least(1))
    """Passes over each step's rollouts for the critic."""
    mini_batch_size: int = attrs.field(default=0, validator=at_least(0))
    """Prompts per critic optimizer step; 0 = data.batch_size."""
    micro_batch_size: int = attrs.field(default=0, validator=at_least(0))
    """Rows per critic forward/backward; 0 = the whole mini-batch."""
    max_tokens_per_micro_batch: int = attrs.field(default=0, validator=at_least(0))
    """Instead of micro_batch_size: critic micro-batches of at most this many tokens (padded, or real when
    packed); 0 = off."""
    share_prompts: bool = True
    """As actor.share_prompts, for the value passes and the critic update."""
    pack: Pack = "auto"
    """As actor.pack, for the value passes and the critic update."""
    cliprange_value: float = attrs.field(default=0.5, validator=at_least(0))
    """Value clipping around the old values (PPO-style)."""
    loss_agg_mode: LossAggMode = "token-mean"
    """Aggregation of the value loss."""


@attrs.define
class ReferenceConfig:
    enable: bool = False
    """Keep a frozen copy of the initial policy for KL (in the reward or as a loss)."""


@attrs.define
class TeacherConfig:
    """A frozen teacher whose log-probs of the student's sampled tokens are a pass of each step (on-policy
    distillation: algorithm.advantage_estimator = "distill"; docs/algorithms.md#on-policy-distillation)."""

    path: str = attrs.field(default="", validator=teacher_source)
    """"" (no teacher); a Hugging Face model folder or a .gguf file whose tokenizer is the student's (a worker that
    loads models loads it; another tokenizer is refused: the two models score the same token ids); a peft LoRA
    adapter folder (adapter_config.json) trained on the student's model.path (merged into a copy of it); or a
    nanoverl checkpoint (checkpoints/step_<N>) or run directory (its newest complete checkpoint): the policy it
    saved, on the student's architecture (model.path), with any worker. Frozen (a data-parallel worker shards
    it like the reference); scored at rollout.temperature, as the student's log-probs are."""

    @property
    def enable(self) -> bool:
        return bool(self.path)

    @property
    def adapter(self) -> bool:
        """path names a peft LoRA adapter folder (the worker merges it into a copy of the student's model)."""
        return self.enable and teacher_folder(self.path) == "adapter"

    @property
    def from_checkpoint(self) -> bool:
        """path names a nanoverl checkpoint or run directory (the worker builds the student's architecture and
        the trainer loads the checkpoint's policy into it), not a model."""
        return self.enable and teacher_folder(self.path) == "checkpoint"


Level = Literal["off", "token", "sequence", "geometric"]
CORRECTION_LEVELS: tuple[str, ...] = get_args(Level)
"""The levels of is_level and rs_level (`algos.compute_rollout_correction` checks its arguments against
them); the one list of these names."""
RsKL = Literal["off", "token_k2", "token_k3", "seq_sum_k2", "seq_sum_k3", "seq_mean_k2", "seq_mean_k3",
               "seq_max_k2", "seq_max_k3"]
RS_KL_OPTIONS: tuple[str, ...] = get_args(RsKL)
"""The choices of rs_kl; the one list of these names."""


@attrs.define
class RolloutCorrectionConfig:
    """Rollout-trainer mismatch correction (algos/rollout_correction.py has verl's and TRL's names)."""

    is_level: Level = "off"
    """Importance weights pi_train / pi_rollout on the policy loss: per token (TIS), per sequence
    (product) or its geometric mean; needs a rollout that returns its log-probs."""
    is_threshold: float = attrs.field(default=2.0, validator=above(0))
    """Upper bound C of the importance weights: min(w, C) (truncation)."""
    is_threshold_low: float | None = attrs.field(default=None, validator=at_least(0, optional=True))
    """Set a lower bound L to zero weights outside [L, C] instead of truncating (IcePop / masked IS)."""
    is_batch_normalize: bool = False
    """Divide the weights by their batch mean."""
    rs_level: Level = "off"
    """Rejection: drop tokens (or whole sequences) whose ratio leaves [rs_threshold_low, rs_threshold_high]."""
    rs_threshold_high: float = attrs.field(default=2.0, validator=above(0))
    """Upper bound of the rejection band (on pi_train / pi_rollout)."""
    rs_threshold_low: float | None = attrs.field(default=None, validator=above(0, optional=True))
    """Lower bound of the rejection band; unset: 1 / rs_threshold_high."""
    rs_kl: RsKL = "off"
    """Also drop tokens / sequences whose k2 or k3 KL estimate (per token, or its sum / mean / max) exceeds rs_kl_threshold."""
    rs_kl_threshold: float = attrs.field(default=0.0, validator=at_least(0))
    """Threshold of rs_kl (positive when rs_kl is on)."""

    @property
    def enabled(self) -> bool:
        return (self.is_level, self.rs_level, self.rs_kl) != ("off", "off", "off")


@attrs.define
class AlgorithmConfig:
    advantage_estimator: str = "gae"
    """A registered advantage estimator (`nanoverl-train plugins` lists them; the core has gae,
    reinforce_plus_plus and distill)."""
    gamma: float = attrs.field(default=1.0, validator=between(0, 1))
    """Discount factor."""
    lam: float = attrs.field(default=1.0, validator=between(0, 1))
    """GAE lambda."""
    whiten_advantages: bool = False
    """GAE: normalise advantages to zero mean / unit variance over valid tokens."""
    filter_groups: bool = False
    """DAPO's dynamic sampling: drop groups whose scores are all equal (they carry no signal) and sample
    more prompts until data.batch_size groups are left, or filter_groups_max_rounds rounds ran."""
    filter_groups_max_rounds: int = attrs.field(default=10, validator=at_least(1))
    """filter_groups: the most generation rounds (data.batch_size fresh prompts, rollout and reward) one step
    takes, the first included (verl's max_num_gen_batches; 1 = no refill). When they are spent the step
    trains on the groups it has (the metric filter/batch_full is 0)."""
    mask_truncated: bool = False
    """DAPO overlong filtering (TRL mask_truncated_completions): responses cut at rollout.max_new_tokens
    without EOS are masked out of the loss; their scores still count in group baselines."""
    use_kl_in_reward: bool = False
    """Subtract kl_coef * KL(pi_old || ref) from the token-level reward (needs reference.enable)."""
    kl_penalty: KLEstimator = "k1"
    """KL estimator used in the reward."""
    kl_ctrl: Literal["fixed", "adaptive"] = "fixed"
    """Fixed kl_coef, or the adaptive controller of Ziegler et al. steering to target_kl."""
    kl_coef: float = attrs.field(default=0.001, validator=at_least(0))
    """Initial / fixed coefficient of the in-reward KL penalty."""
    target_kl: float = attrs.field(default=0.1, validator=above(0))
    """Adaptive controller: the KL it steers toward."""
    kl_horizon: int = attrs.field(default=10000, validator=at_least(1))
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
    file: str = attrs.field(default="", validator=python_file)
    """A .py file defining this component (runs its code; a warning says so)."""
    function: str = "compute_score"
    """Function name inside `file`."""
    weight: float = attrs.field(default=1.0, validator=finite())
    """This component's weight in the score (negative for a penalty)."""

    @property
    def label(self) -> str:
        """The name in metrics: reward/<label>/mean."""
        return self.name or Path(self.file).stem


@attrs.define
class RewardConfig:
    name: str = "exact_match"
    """A registered reward function (`nanoverl-train plugins` lists them). Empty when reward.file or
    [[reward.components]] names what runs: both in the config file (or both overrides) is an error, an
    override of one drops the config file's other with a warning."""
    file: str = attrs.field(default="", validator=python_file)
    """Optional path to a .py file defining the reward (runs its code; a warning says so); a verl-style
    `compute_score(data_source, solution_str, ground_truth, extra_info)` (or any subset of those names)
    and a TRL reward function `(prompts, completions, **kwargs) -> list[float]` run unchanged."""
    function: str = "compute_score"
    """Function name inside `file`."""
    components: list[RewardComponent] = attrs.Factory(list)
    """Several rewards with weights, instead of name / file: [[reward.components]] tables of name or
    file (+ function) and weight; each logged as reward/<name>/mean, the weighted sum is the score."""
    workers: int = attrs.field(default=4, validator=at_least(0))
    """Worker processes that score in parallel (a crash or hang there never touches the trainer);
    0 scores in the trainer process (for debugging: timeouts then hold only in the main thread)."""
    timeout_s: float = attrs.field(default=0.0, validator=at_least(0))
    """Per-call time limit in seconds (0: none). A call that runs over is an error (its worker is killed)."""
    memory_limit_mb: int = attrs.field(default=0, validator=at_least(0))
    """Address-space limit of each worker process (RLIMIT_AS) in MiB, so a leaking reward fails with
    MemoryError or dies instead of exhausting the machine; 0: no limit."""
    on_error: Literal["raise", "zero", "drop"] = "raise"
    """A call that raises, hangs, returns a non-number, kills its worker, or that a batched reward fails
    (the judge's judge_timeout, ...): "raise" stops (exit 2, naming the row); "zero" scores it 0; "drop"
    takes the row out of training (no tokens in the loss_mask, a group of its own, so group baselines are
    the other rows'; reward/dropped; validation scores it 0). "zero" and "drop" count it in reward/errors
    and reward/errors/<kind> (reward/timeouts, reward/crashes) and continue. Either way the row goes to
    reward_errors.jsonl in the run directory."""
    overlong_buffer_len: int = attrs.field(default=0, validator=at_least(0))
    """DAPO soft overlong punishment: a response longer than rollout.max_new_tokens - this many tokens
    loses up to overlong_penalty_factor, linearly over the buffer (verl overlong_buffer.len); 0: off.
    Training scores only: validation measures the task."""
    overlong_penalty_factor: float = attrs.field(default=1.0, validator=at_least(0))
    """The penalty at rollout.max_new_tokens (verl overlong_buffer.penalty_factor)."""
    pass_threshold: float = attrs.field(default=1.0, validator=finite())
    """Validation pass@k: a sample passes when its score is at least this."""
    settings: Any = _settings()
    """The selected reward's own settings, written as [reward.<name>] (with components: a dict by name)."""

    def __attrs_post_init__(self) -> None:
        if (self.file or self.components) and self.name == "exact_match":
            self.name = ""  # the default name does not run: the config says what does, once


@attrs.define
class EnvironmentConfig:
    """[environment]: multi-turn episodes (docs/multiturn.md). Empty name: one prompt, one response."""

    name: str = ""
    """A registered environment (`nanoverl-train plugins` lists them); every rollout then runs episodes."""
    file: str = attrs.field(default="", validator=python_file)
    """Instead of a name: a .py file holding the environment (runs its code; a warning says so), with
    `function` (an environment factory) or `tools` (plain functions as tools). It runs in the environment
    workers like a registered one."""
    function: str = ""
    """The environment factory in `file`: `make_env(sample[, settings]) -> Environment`, as registered ones."""
    tools: list[str] = attrs.Factory(list)
    """Instead of `function`: plain functions in `file` (type hints, a Google-style docstring) the model calls
    as tools in the `<tool_call>` format, with their schemas in every prompt (nanoverl_core.env.tool_environment)."""
    max_turns: int = attrs.field(default=4, validator=at_least(1))
    """Model turns per episode at most; the environment's answer to the last one is not appended."""
    max_turn_tokens: int = attrs.field(default=0, validator=at_least(0))
    """Tokens one model turn may sample (0: whatever is left of the episode's budget, which is
    rollout.max_new_tokens for the model's and the environment's tokens together)."""
    reward_weight: float = attrs.field(default=1.0, validator=finite())
    """Weight of the environment's rewards in the score (each on the last token of its turn)."""
    score_answer: bool = True
    """Also score the last model turn's text with [reward] (added with weight 1); false: the
    environment's rewards alone."""
    workers: int = attrs.field(default=2, validator=at_least(0))
    """Worker processes that hold the episodes' environments (one that crashes or hangs costs its episodes,
    never the run); 0 runs them in the trainer process (for debugging: no crash isolation)."""
    timeout_s: float = attrs.field(default=30.0, validator=at_least(0))
    """Time limit in seconds of each environment call (start, step, close); 0: none."""
    on_error: Literal["raise", "zero"] = "raise"
    """An environment that raises, hangs or answers with something unusable: "raise" stops (exit 2,
    naming the row and turn), "zero" ends that episode with score 0, counts it in episode/errors and
    writes it to reward_errors.jsonl."""
    settings: Any = _settings()
    """The selected environment's own settings, written as [environment.<name>]."""


@attrs.define
class AgentConfig:
    """[agent]: agent programs written against an OpenAI client, trained through the endpoint the rollout
    serves (docs/agents.md). Empty name, file and command: no agents."""

    name: str = ""
    """A registered agent (`nanoverl-train plugins` lists them)."""
    file: str = attrs.field(default="", validator=python_file)
    """Instead of a name: a .py file holding the agent function (runs its code; a warning says so)."""
    function: str = ""
    """The agent function in `file`: `agent(row, client[, settings])`, sync or async, returning the
    episode's reward or None (scoring left to [reward] on the last model turn's text)."""
    command: list[str] = attrs.Factory(list)
    """Instead of a function: a program started once per episode, with OPENAI_BASE_URL, OPENAI_API_KEY and
    NANOVERL_ROW (the row as JSON, also on its stdin); its last line of output is its reward (JSON)."""
    workers: int = attrs.field(default=2, validator=at_least(1))
    """Worker processes the agents run in, each its share of a batch's agents at once."""
    timeout_s: float = attrs.field(default=120.0, validator=at_least(0))
    """Time limit in seconds of one agent's whole episode; 0: none."""
    on_error: Literal["raise", "zero"] = "raise"
    """An agent that fails (raises, hangs, crashes, never calls the model, floods it, sends a request the
    endpoint refuses, or a history that does not extend): "raise" stops (exit 2, naming the row), "zero"
    scores that row 0, counts the kind in episode/error_<kind>/rate and writes it to reward_errors.jsonl."""
    max_calls: int = attrs.field(default=32, validator=at_least(1))
    """Model calls one episode may make; the next is refused (429) and the episode fails as `flood`."""
    score_answer: bool = True
    """Also score the last model turn's text with [reward] (added with weight 1); false: the agent's reward alone."""
    reward_weight: float = attrs.field(default=1.0, validator=finite())
    """Weight of the reward the agent returns (on the row's last model token)."""
    tool_format: Literal["auto", "template", "hermes"] = "auto"
    """How the tools of a request reach the model: the chat template's own tool format ("template"), the
    Hermes `<tool_call>` block in the system message ("hermes"), or the template's where it renders tools
    and Hermes' otherwise ("auto"). Calls are read from `<tool_call>` JSON in either case."""
    max_prompt_tokens: int = attrs.field(default=2048, validator=at_least(1))
    """The longest first-call prompt an agent may send (tokens); a longer one is refused."""
    batch_window_ms: float = attrs.field(default=1000.0, validator=at_least(0))
    """Calls go to the engine together once every running agent waits on one (lockstep rounds, as
    environment episodes run, so batches and samples repeat and runs resume exactly), or this long after
    the oldest queued call, so an agent busy with its own work (or hung) holds the others back no longer;
    0: no limit (an agent's timeout_s is the only one)."""
    settings: Any = _settings()
    """The selected agent's own settings, written as [agent.<name>]."""

    @property
    def enabled(self) -> bool:
        return bool(self.name or self.file or self.command)


@attrs.define
class TrackingConfig:
    trackers: list[str] = attrs.Factory(lambda: ["console", "jsonl", "plot"])
    """Registered trackers: console, jsonl (metrics.jsonl), plot (metrics.png); mlflow, tensorboard and wandb
    from their plugins (nanoverl[mlflow], ...)."""
    settings: dict[str, Any] = attrs.field(factory=dict, init=False)
    """Each selected tracker's own settings by tracker name, written as [tracking.<name>] (the MLflow
    store, experiment and run name: [tracking.mlflow])."""


@attrs.define
class Config:
    trainer: TrainerConfig = attrs.Factory(TrainerConfig)
    data: DataConfig = attrs.Factory(DataConfig)
    model: ModelConfig = attrs.Factory(ModelConfig)
    rollout: RolloutConfig = attrs.Factory(RolloutConfig)
    worker: WorkerConfig = attrs.Factory(WorkerConfig)
    actor: ActorConfig = attrs.Factory(ActorConfig)
    critic: CriticConfig = attrs.Factory(CriticConfig)
    reference: ReferenceConfig = attrs.Factory(ReferenceConfig)
    teacher: TeacherConfig = attrs.Factory(TeacherConfig)
    algorithm: AlgorithmConfig = attrs.Factory(AlgorithmConfig)
    reward: RewardConfig = attrs.Factory(RewardConfig)
    environment: EnvironmentConfig = attrs.Factory(EnvironmentConfig)
    agent: AgentConfig = attrs.Factory(AgentConfig)
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
        data = converter.unstructure(self)
        for section in COMPONENTS:
            for name, settings in settings_by_name(self, section).items():
                if settings is not None:
                    data[section][name] = converter.unstructure(settings)
        return data

    def validate(self, *, training: bool = True) -> "Config":
        """Reject impossible combinations before anything heavy loads (the rules, section by section, are
        in rules.py); `training` false: a config that only evaluates (no training data needed)."""
        check_config(self, training=training)
        return self


def _target_modules(value: Any, _: Any) -> str | list[str]:
    if isinstance(value, str) or isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise ValueError(f"expected \"all-linear\" or a list of module names, got {type(value).__name__} {value!r}")


converter.register_structure_hook(TargetModules, _target_modules)
