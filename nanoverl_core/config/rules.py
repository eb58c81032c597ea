"""Cross-field rules, one function per config section: batch sizes that divide, a critic key with the
critic off, a KL term without a reference, ... (one key's own range is its domain, declared at the field:
domains.py). `Config.validate` runs `check_config` before anything
heavy loads; the first broken rule is one `ConfigError` naming the key and the fix.

The sections run in the order of the config file; the data files come last, so a config written to try
one rule reports that rule even before it names its data.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from ..errors import ConfigError

Config = Any
"""A nanoverl_core.config.Config (schema.py imports this module: a type name here, not an import)."""


def check_config(config: Config, *, training: bool = True) -> None:
    """Raise a ConfigError for the first impossible combination; `training` false (`nanoverl-train eval`)
    skips what only a training run needs (training data)."""
    for rule in SECTION_RULES:
        rule(config)
    if training:
        training_data_rules(config)


def _changed_fields(obj: Any, default: Any, ignore: set[str]) -> list[str]:
    return [f.name for f in attrs.fields(type(obj))
            if f.name not in ignore and getattr(obj, f.name) != getattr(default, f.name)]


def trainer_rules(config: Config) -> None:
    t = config.trainer
    if t.total_epochs and t.total_steps is not None:
        raise ConfigError(f"trainer.total_epochs = {t.total_epochs} and trainer.total_steps = {t.total_steps} are "
                          "both set; set one: a number of passes over the training rows, or of steps")
    if t.total_steps is None and not t.total_epochs:
        raise ConfigError("trainer.total_steps is unset and trainer.total_epochs = 0; set one of them")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", t.device):
        raise ConfigError(f"trainer.device = {t.device!r} is not a supported device; use auto, cpu, cuda or cuda:N")


def rollout_rules(config: Config) -> None:
    if config.rollout.temperature == 0:
        raise ConfigError("rollout.temperature = 0 is greedy, which gives every sample of a prompt the same "
                          "response; use a positive temperature for training (val_temperature may be 0)")


def _update_rules(config: Config, section: str, mini: int) -> None:
    """What the actor and the critic share: mini- and micro-batch sizes that fit."""
    part = getattr(config, section)
    if part.micro_batch_size and part.max_tokens_per_micro_batch:
        raise ConfigError(f"{section}.micro_batch_size and {section}.max_tokens_per_micro_batch are both set; "
                          "set one: a row count or a token budget per micro-batch")
    batch_size, n, micro = config.data.batch_size, config.rollout.n, part.micro_batch_size
    if batch_size % mini:
        raise ConfigError(f"{section}.mini_batch_size = {mini} must divide data.batch_size = {batch_size}")
    if micro and (mini * n) % micro:
        raise ConfigError(f"{section}.micro_batch_size = {micro} must divide the mini-batch's rows "
                          f"({section}.mini_batch_size * rollout.n = {mini * n})")


def actor_rules(config: Config) -> None:
    _update_rules(config, "actor", config.actor_mini_batch_size)


def critic_rules(config: Config) -> None:
    c, warmup, steps = config.critic, config.trainer.critic_warmup, config.trainer.total_steps
    _update_rules(config, "critic", config.critic_mini_batch_size)
    if warmup and not c.enable:
        raise ConfigError(f"trainer.critic_warmup = {warmup} but critic.enable = false: its steps would update "
                          "nothing; set critic.enable = true or remove trainer.critic_warmup")
    if warmup and steps is not None and warmup >= steps:
        raise ConfigError(f"trainer.critic_warmup = {warmup} is not below trainer.total_steps = {steps}: the actor "
                          "would never update; lower the warmup or raise total_steps")
    if not c.enable:
        changed = _changed_fields(c, type(c)(), ignore={"enable"})
        if changed:
            raise ConfigError(f"critic.{changed[0]} is set but critic.enable = false; "
                              "set critic.enable = true or remove the critic keys")


def reference_rules(config: Config) -> None:
    needs_ref = [k for k, on in (("actor.use_kl_loss", config.actor.use_kl_loss),
                                 ("algorithm.use_kl_in_reward", config.algorithm.use_kl_in_reward)) if on]
    if needs_ref and not config.reference.enable:
        raise ConfigError(f"{needs_ref[0]} = true needs a reference policy; set reference.enable = true")


def algorithm_rules(config: Config) -> None:
    alg = config.algorithm
    rc = alg.rollout_correction
    if rc.is_threshold_low is not None and rc.is_threshold_low > rc.is_threshold:
        raise ConfigError("algorithm.rollout_correction.is_threshold_low, if set, must be in [0, is_threshold]; "
                          f"got {rc.is_threshold_low} above is_threshold = {rc.is_threshold}")
    if rc.rs_threshold_low is not None and rc.rs_threshold_low > rc.rs_threshold_high:
        raise ConfigError("algorithm.rollout_correction.rs_threshold_low, if set, must be in (0, rs_threshold_high]; "
                          f"got {rc.rs_threshold_low} above rs_threshold_high = {rc.rs_threshold_high}")
    if rc.rs_kl != "off" and rc.rs_kl_threshold <= 0:
        raise ConfigError(f"algorithm.rollout_correction.rs_kl = {rc.rs_kl!r} needs a positive rs_kl_threshold")
    if alg.filter_groups and config.rollout.n < 2:
        raise ConfigError("algorithm.filter_groups = true needs rollout.n >= 2: a group of one has no spread "
                          "and is always dropped")
    if not alg.filter_groups and alg.filter_groups_max_rounds != type(alg)().filter_groups_max_rounds:
        raise ConfigError("algorithm.filter_groups_max_rounds is set but algorithm.filter_groups = false; "
                          "set algorithm.filter_groups = true or remove the key")


def model_rules(config: Config) -> None:
    m = config.model
    if m.compute_dtype not in ("", "auto") and m.dtype != "float32" and m.compute_dtype != m.dtype:
        raise ConfigError(f"model.compute_dtype = {m.compute_dtype!r} with model.dtype = {m.dtype!r}: autocast "
                          "computes in a narrower dtype than the weights', not another one; set model.dtype = "
                          "\"float32\" (float32 weights, mixed-precision compute) or leave model.compute_dtype empty")


def lora_rules(config: Config) -> None:
    lora = config.model.lora
    if not lora.enable:
        changed = _changed_fields(lora, type(lora)(), ignore={"enable"})
        if changed:
            raise ConfigError(f"model.lora.{changed[0]} is set but model.lora.enable = false; "
                              "set model.lora.enable = true or remove the model.lora keys")
        return
    targets = lora.target_modules
    if isinstance(targets, str) and targets != "all-linear" or isinstance(targets, list) and (
            not targets or "all-linear" in targets):
        raise ConfigError(f"model.lora.target_modules = {targets!r} must be \"all-linear\" or a non-empty list of "
                          "module names, e.g. [\"q_proj\", \"v_proj\"]")


def reward_rules(config: Config) -> None:
    rw = config.reward
    if rw.overlong_buffer_len > config.rollout.max_new_tokens:
        raise ConfigError(f"reward.overlong_buffer_len = {rw.overlong_buffer_len} must not exceed "
                          f"rollout.max_new_tokens = {config.rollout.max_new_tokens}")
    if rw.components:
        _reward_component_rules(rw)


def _reward_component_rules(rw: Any) -> None:
    set_too = [k for k in ("name", "file", "function") if getattr(rw, k) not in ("", getattr(type(rw)(), k))]
    if set_too:
        raise ConfigError(f"reward.{set_too[0]} is set next to [[reward.components]]; name each reward in a "
                          "component (name or file, and weight) and remove reward.name / reward.file")
    labels = set()
    for i, comp in enumerate(rw.components):
        key = f"reward.components[{i}]"
        if not comp.name and not comp.file:
            raise ConfigError(f"{key} names no reward; set its name (a registered reward) or file")
        if comp.label in labels:
            raise ConfigError(f"{key}: two components are called {comp.label!r}; give one a different name "
                              "(with a file, name is only its label)")
        labels.add(comp.label)


def environment_rules(config: Config) -> None:
    env = config.environment
    if env.name and env.file:
        raise ConfigError(f"environment.name = {env.name!r} is set next to environment.file = {env.file!r}; set one "
                          "of them: a registered environment, or one from a file")
    given = [k for k, default in (("function", ""), ("tools", [])) if getattr(env, k) != default]
    if given and not env.file:
        raise ConfigError(f"environment.{given[0]} is set but environment.file is empty, and it only applies to a "
                          "file; set environment.file or remove the key")
    if env.file and bool(env.function) == bool(env.tools):
        raise ConfigError(f"environment.file = {env.file!r} needs one of environment.function (an environment "
                          "factory in the file) and environment.tools (functions in it the model calls as tools)"
                          + (", not both" if env.function else ""))


def agent_rules(config: Config) -> None:
    agent = config.agent
    given = [k for k in ("name", "file", "command") if getattr(agent, k)]
    if len(given) > 1:
        raise ConfigError(f"agent.{given[0]} and agent.{given[1]} are both set; set one of them: a registered "
                          "agent, a file with agent.function, or a program (agent.command)")
    if bool(agent.file) != bool(agent.function):
        raise ConfigError("agent.file needs agent.function (the agent function in the file)" if agent.file else
                          "agent.function is set but agent.file is empty; set agent.file or remove the key")
    if agent.enabled and (config.environment.name or config.environment.file):
        raise ConfigError("[agent] and [environment] are both set; an agent drives its own episodes through the "
                          "endpoint: remove one of them (docs/agents.md)")


def data_file_rules(config: Config) -> None:
    if config.data.source != "files":
        given = [k for k in ("train_files", "val_files") if getattr(config.data, k)]
        if given:
            raise ConfigError(f"data.{given[0]} is set but data.source = {config.data.source!r} draws its own rows; "
                              "remove the files, or set data.source = \"files\"")
        return
    if config.trainer.eval_before_after and not config.data.val_files:
        raise ConfigError("trainer.eval_before_after = true evaluates on data.val_files, which is empty; "
                          "name a validation file or set trainer.eval_before_after = false")


def training_data_rules(config: Config) -> None:
    if config.data.source == "files" and not config.data.train_files:
        raise ConfigError("data.train_files is empty; name at least one jsonl / json / parquet file, in a "
                          "--config file or as an override (data.train_files=train.parquet)")


SECTION_RULES = (trainer_rules, rollout_rules, actor_rules, critic_rules, reference_rules,
                 algorithm_rules, model_rules, lora_rules, reward_rules, environment_rules, agent_rules,
                 data_file_rules)
"""The order `check_config` runs them in."""
