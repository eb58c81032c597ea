"""Resolve every plugin name a config uses, before any model loads, so a typo fails in a second."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from ..algos.rollout_correction import truncated_sampling_warning
from ..config import Config, component_settings
from ..errors import ConfigError, DataError, PluginError, UserError, one_line
from ..plugins import Registry, install_hint
from ..reward import RewardScorer
from ..workers.forward import planned
from .plan import plan_step


def resolve_plugins(config: Config, registry: Registry, *, import_backends: bool = True) -> dict[str, Any]:
    """The objects the run uses (worker and rollout factories imported only if `import_backends`)."""
    registry.check_imports()
    for kind, name, key in (("worker", config.worker.name, "worker.name"),
                            ("rollout", config.rollout.name, "rollout.name")):
        registry.entry(kind, name, key)                 # known names; imported below only with import_backends
    policy_loss = registry.get("policy_loss", config.actor.policy_loss, key="actor.policy_loss")
    component_settings(config, registry)  # defaults for a config built in code; a loaded one keeps its own
    if config.model.lora.enable:
        _check_lora_worker(config, registry)
    estimator = resolve_estimator(config, registry)
    source = registry.get("data_source", config.data.source, key="data.source")
    check = getattr(source, "check_config", None)       # bad generator settings, before anything is written
    if check is not None:
        check(config)
    env = config.environment
    make_env, env_source = load_environment(config, registry)
    agent_source = load_agent(config, registry)
    score_answer = config.agent.score_answer if agent_source else make_env is None or env.score_answer
    resolved = {"estimator": estimator, "data_source": source,
                "reward": RewardScorer(config.reward, registry, run_dir=config.trainer.output_dir,
                                       max_new_tokens=config.rollout.max_new_tokens, score_answer=score_answer,
                                       prompt_key=config.data.prompt_key),
                "environment": make_env, "environment_source": env_source, "agent_source": agent_source,
                "policy_loss": policy_loss,
                "trackers": [registry.get("tracker", name, key="tracking.trackers") for name in config.tracking.trackers]}
    for check in filter(None, (getattr(fn, "check_config", None) for fn in resolved["reward"].fns)):
        check(config)                                   # a reward's settings, files, URLs: before anything is written
    if import_backends:
        resolved["worker"] = registry.get("worker", config.worker.name, key="worker.name")
        resolved["rollout"] = registry.get("rollout", config.rollout.name, key="rollout.name")
        for kind in ("worker", "rollout"):                          # cheap checks (files, packages, settings) before
            check = getattr(resolved[kind], "check_config", None)   # the run directory is written or a model loads
            if check is not None:
                check(config)
    return resolved


def resolve_estimator(config: Config, registry: Registry) -> Any:
    """algorithm.advantage_estimator, bound to what it builds on (distill: its task estimator), checked against
    what it needs: a critic, a teacher, and its own check_config."""
    name = config.algorithm.advantage_estimator
    estimator = registry.get("advantage_estimator", name, key="algorithm.advantage_estimator")
    bind = getattr(estimator, "bind", None)
    if bind is not None:
        estimator = bind(config, registry)
    if getattr(estimator, "requires_critic", False) and not config.critic.enable:
        raise ConfigError(f"algorithm.advantage_estimator = {name!r} needs a critic; "
                          "set critic.enable = true, or pick an estimator without one (e.g. grpo)")
    reads_teacher = bool(getattr(estimator, "requires_teacher", False))
    if reads_teacher and not config.teacher.enable:
        raise ConfigError(f"algorithm.advantage_estimator = {name!r} needs a teacher; set teacher.path to a model "
                          "folder, a .gguf file or a nanoverl checkpoint (docs/algorithms.md#on-policy-distillation)")
    if config.teacher.enable and not reads_teacher:
        raise ConfigError(f"teacher.path is set but algorithm.advantage_estimator = {name!r} does not read a "
                          "teacher; use \"distill\" (with [algorithm.distill] task_estimator for a task reward too) "
                          "or remove [teacher]")
    check = getattr(estimator, "check_config", None)    # what else it needs of the config (a ConfigError if not)
    if check is not None:
        check(config)
    return estimator


def check_before_start(config: Config, plugins: dict[str, Any]) -> None:
    """What a training run checks before it writes anything, and --dry-run checks too (a dry-run that passes
    means the run starts): the checkpoint trainer.resume names, and rollout correction with a rollout whose
    settings say it returns no log-probs (`[rollout.<name>] log_probs = false`, or no such setting)."""
    from .checkpoint import checkpoint_root, resume_target

    resume_target(config.trainer.resume, checkpoint_root(config.trainer.output_dir))
    if config.teacher.enable:
        teacher_checkpoint(config)
    if not rollout_log_probs(config):  # one that does is checked on the built rollout (its truncation warning once)
        check_rollout_log_probs(config, None)


def rollout_log_probs(config: Config) -> bool:
    """Whether the selected rollout returns its log-probs, as its settings declare it (`log_probs`: the
    debug and vllm rollouts; a rollout without that setting is taken to return none)."""
    return bool(getattr(config.rollout.settings, "log_probs", False))


def build_workers(plugins: dict[str, Any], config: Config):
    """The selected worker factory's Workers. A model the worker's own code refuses to build (a hidden size
    its head count does not divide, in model.path's config.json or the worker's settings: transformers'
    ValueError, torch's RuntimeError) is one ConfigError naming the keys that shaped it."""
    try:
        workers = plugins["worker"](config)
    except (ValueError, RuntimeError) as exc:
        if isinstance(exc, UserError):
            raise
        detail = one_line(exc)
        name = config.worker.name
        raise ConfigError(f"worker.name = {name!r} cannot build the model ({detail}); check the model's shape in "
                          f"{'model.path = ' + repr(config.model.path) if config.model.path else f'[worker.{name}]'}"
                          f" and the model / [worker.{name}] settings") from None
    check_actor_update(workers.actor, config.worker.name)
    if config.teacher.enable:
        load_teacher(config, workers)
    return workers


def teacher_checkpoint(config: Config) -> Path | None:
    """The checkpoint teacher.path names (a checkpoint, or a run directory's newest), or None for a model; a
    path that is not there is one ConfigError."""
    from .checkpoint import find_checkpoint

    if not Path(config.teacher.path).expanduser().exists():
        raise ConfigError(f"teacher.path = {config.teacher.path!r} does not exist; name a model folder, a .gguf file, "
                          "a nanoverl checkpoint (checkpoints/step_<N>) or a run directory")
    return find_checkpoint(Path(config.teacher.path).expanduser(), "teacher.path") if config.teacher.from_checkpoint \
        else None


def load_teacher(config: Config, workers) -> None:
    """The worker built the teacher (a model, or the student's architecture for a checkpoint, loaded here)."""
    from .checkpoint import reading_checkpoint

    if workers.teacher is None:
        raise ConfigError(f"teacher.path is set but worker.name = {config.worker.name!r} built no teacher "
                          "(Workers.teacher); use a worker that builds one (debug, hf, fsdp)")
    checkpoint = teacher_checkpoint(config)
    if checkpoint is not None:
        with reading_checkpoint(checkpoint):
            workers.teacher.load(checkpoint / "actor")


def build_rollout(plugins: dict[str, Any], config: Config, workers):
    """The selected rollout, running multi-turn episodes (nanoverl_core.env) when environment.name is set."""
    rollout = plugins["rollout"](config, workers)
    if plugins.get("agent_source") is not None:
        from ..agents import AgentRollout
        return AgentRollout(rollout, plugins["agent_source"], config, workers.tokenizer,
                            model_name=config.model.path or config.rollout.name)
    if plugins["environment"] is None:
        return rollout
    from ..env import EpisodeRollout, environment_calls
    source = plugins["environment_source"]
    calls = environment_calls(config.environment, plugins["environment"], source)
    return EpisodeRollout(rollout, calls, config, workers.tokenizer, name=source.label)


def load_agent(config: Config, registry: Registry):
    """The AgentSource of [agent] (None without one): a registered agent's "module:attr", a file's function
    (its code run here, so a missing function fails now; a warning says so), or a program that must exist.
    The endpoint serves through FastAPI and uvicorn, and agents get `openai` clients: without them, one line."""
    from ..agents.source import AgentSource
    agent = config.agent
    if not agent.enabled:
        return None
    missing = [m for m in ("fastapi", "uvicorn", "openai", "httpx") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"[agent] needs {', '.join(missing)}: {install_hint('agents')}")
    if agent.name:
        registry.entry("agent", agent.name, key="agent.name")
        obj = registry.entry("agent", agent.name).obj
        if not isinstance(obj, str):
            raise PluginError(f"agent.name = {agent.name!r} is registered as an object; register it as a "
                              "\"module:attr\" string so the agent workers can import it")
        check = getattr(registry.get("agent", agent.name, key="agent.name"), "check_config", None)
        if check is not None:                   # what it needs of the config, before the run directory or a model
            check(config)
        return AgentSource(name=agent.name, ref=obj)
    source = AgentSource.from_config(agent)
    if agent.file and Path(agent.file).is_file():
        print(f"warning: agent.file runs the Python code in {agent.file}; only use files you trust", file=sys.stderr)
    source.check()
    source.load()
    return source


def load_environment(config: Config, registry: Registry) -> tuple[Any, Any]:
    """(factory, EnvironmentSource) of [environment]: a registered name (imported by a worker through the
    "module:attr" it was registered as, or the object's own module and name; "" for a closure or __main__'s),
    a file (environment.file, its code run here: a warning says so), or (None, None) for single-turn runs.
    Tools that go into the prompts must have schemas: a tool without one fails here, naming it."""
    from ..env.source import EnvironmentSource
    from ..reward.calls import importable_ref

    env = config.environment
    if env.file:
        if Path(env.file).is_file():
            print(f"warning: environment.file runs the Python code in {env.file}; only use files you trust",
                  file=sys.stderr)
        source = EnvironmentSource.from_config(env)
        make_env = source.load()
    elif env.name:
        make_env = registry.get("environment", env.name, key="environment.name")
        obj = registry.entry("environment", env.name).obj
        source = EnvironmentSource(name=env.name, ref=obj if isinstance(obj, str) else importable_ref(obj))
    else:
        return None, None
    tools = getattr(make_env, "tools", None)
    if tools:
        from ..env.tools import tool_schemas
        try:
            tool_schemas(tools)
        except ImportError as exc:
            raise ConfigError(f"environment {source.label!r}: {exc}") from None
        except Exception as exc:  # transformers' get_json_schema: no type hints, no docstring, an undocumented argument
            detail = " ".join(str(exc).split())[:300]
            raise ConfigError(f"environment {source.label!r}: a tool has no schema to render into the prompts "
                              f"({detail}); give each tool type hints and a Google-style docstring with Args") from None
    return make_env, source


def prompt_tools(plugins: dict[str, Any], tokenizer=None) -> list | None:
    """The selected environment's tools (rendered into every prompt), or None. With `tokenizer`, the tag
    format's instructions must encode with it (the model reads them in every prompt): if not, one
    ConfigError names the environment, whose text it is, not a data row."""
    tools = getattr(plugins["environment"], "tools", None) or None
    if tools and tokenizer is not None and not getattr(tokenizer, "chat_template", None):
        from ..env.tools import tool_prompt
        try:
            tokenizer.encode(tool_prompt(tools))
        except Exception as exc:
            detail = one_line(exc, 200)
            raise ConfigError(f"environment {plugins['environment_source'].label!r}: the tool instructions it renders "
                              f"into every prompt cannot be encoded by the tokenizer of model.path ({detail}); the "
                              "data rows are not at fault: use a tokenizer that covers the instructions, or an "
                              "environment that renders none (environment.file with a function: "
                              "docs/multiturn.md)") from None
    return tools


def _supports_lora(registry: Registry, name: str) -> bool:
    """A worker factory that trains LoRA adapters says so with `make_workers.supports_lora = True`."""
    try:
        return bool(getattr(registry.get("worker", name, key="worker.name"), "supports_lora", False))
    except Exception:  # a worker that fails to import is reported when selected, not here
        return False


def _check_lora_worker(config: Config, registry: Registry) -> None:
    if not _supports_lora(registry, config.worker.name):
        able = ", ".join(name for name in registry.names("worker") if _supports_lora(registry, name))
        raise ConfigError(f"model.lora.enable = true, but worker.name = {config.worker.name!r} cannot train a LoRA "
                          f"adapter; valid choices: {able or 'none installed (' + install_hint('hf') + ')'}, "
                          "or set model.lora.enable = false")


def describe(config: Config, registry: Registry) -> dict[str, Any]:
    """What --dry-run prints: the resolved config and which distribution provides each chosen name."""
    plugins = resolve_plugins(config, registry, import_backends=False)
    check_before_start(config, plugins)
    schedule = epoch_schedule(config, plugins["data_source"])   # reads the training rows, as the run does
    chosen = [("data_source", config.data.source), ("worker", config.worker.name), ("rollout", config.rollout.name),
              ("advantage_estimator", config.algorithm.advantage_estimator), ("policy_loss", config.actor.policy_loss)]
    if config.reward.components:
        chosen += [("reward", c.name) for c in config.reward.components if not c.file]
    elif not config.reward.file:
        chosen.append(("reward", config.reward.name))
    chosen += [("tracker", name) for name in config.tracking.trackers]
    chosen += [("environment", config.environment.name)] if config.environment.name else []
    chosen += [("agent", config.agent.name)] if config.agent.name else []
    out = {"config": config.to_dict(),
           "plugins": [{"kind": k, "name": n, "provider": registry.entry(k, n).provider} for k, n in chosen],
           "versions": registry.versions()}
    if config.trainer.total_epochs:
        out["schedule"] = schedule
    facts = dict(reference=config.reference.enable, critic=config.critic.enable, teacher=config.teacher.enable,
                 rollout_log_probs=rollout_log_probs(config))
    out["step_plan"] = plan_step(config, plugins["estimator"], **facts).describe()
    if plugins["agent_source"] is not None:
        out["step_plan"]["agents"] = (f"{plugins['agent_source'].label} in {config.agent.workers} worker processes, "
                                      f"its calls sampled by rollout.name = {config.rollout.name!r} through the "
                                      f"OpenAI-compatible endpoint (tools: {config.agent.tool_format})")
    for key in ("actor", "critic") if config.critic.enable else ("actor",):   # the reference's is the actor's
        out["step_plan"][f"{key}_forward"] = planned(config, key)
    if config.model.compute_dtype == "auto":
        from ..workers.precision import pick_compute_dtype
        dtype, why = pick_compute_dtype(config.trainer.device)
        out["step_plan"]["compute_dtype"] = f"auto: {dtype or 'float32'} on this machine ({why})"
    if config.trainer.critic_warmup:                    # steps 1..critic_warmup train the critic alone
        out["step_plan_in_critic_warmup"] = plan_step(config, plugins["estimator"], **facts, actor_update=False).describe()
    return out


def check_actor_update(actor: Any, worker: str) -> None:
    """An actor written to 0.1.0's contract (`update(batch, *, on_policy)`, no policy loss) is one line, not a
    TypeError at step 1."""
    params = inspect.signature(actor.update).parameters.values()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if len(positional) < 2 and not any(p.kind == p.VAR_POSITIONAL for p in positional):
        raise PluginError(f"worker.name = {worker!r}: its actor's update{inspect.signature(actor.update)} takes no "
                          "policy loss; since nanoverl 0.2.0 the trainer calls update(batch, policy_loss, *, "
                          "on_policy) (nanoverl_core.protocols.Actor, CHANGELOG.md)")


def epoch_schedule(config: Config, make_source) -> dict[str, Any]:
    """trainer.total_epochs as steps, from the training rows of epoch 0 as the source gives them (the run
    counts them after data.max_prompt_length, and for a generated source the validation prompts, drop some)."""
    source = make_source(config)
    rows = sum(1 for _ in source.rows("train", 0))
    check_val_rows(config, len(source.rows("val", 0)))  # the run reads them before its first step too
    per_epoch = rows // config.data.batch_size
    if per_epoch == 0:                                  # the run's sampler refuses this too, before its first step
        raise DataError(f"data.batch_size = {config.data.batch_size} but the training data has only {rows} prompts; "
                        f"lower data.batch_size or add data{'' if rows else ' (the data source gave no training rows)'}")
    return {"total_epochs": config.trainer.total_epochs, "train_rows": rows, "steps_per_epoch": per_epoch,
            "total_steps": config.trainer.total_epochs * per_epoch}


def check_val_rows(config: Config, rows: int) -> None:
    """trainer.eval_before_after needs validation rows."""
    if not rows and config.trainer.eval_before_after:
        raise ConfigError(f"trainer.eval_before_after = true evaluates on the validation rows, but data.source = "
                          f"{config.data.source!r} gives none; give it validation rows (data.val_files, or the "
                          f"source's [data.{config.data.source}] settings) or set trainer.eval_before_after = false")


def check_rollout_log_probs(config: Config, rollout) -> None:
    """Rollout correction needs the engine's own log-probs; a truncated sampling distribution biases them."""
    rc = config.algorithm.rollout_correction
    has = bool(getattr(rollout, "returns_log_probs", False)) if rollout is not None else rollout_log_probs(config)
    if rc.enabled and not has:
        key, value = next((k, v) for k, v in (("is_level", rc.is_level), ("rs_level", rc.rs_level), ("rs_kl", rc.rs_kl))
                          if v != "off")
        raise ConfigError(f"algorithm.rollout_correction.{key} = {value!r} needs the rollout's own log-probs, but "
                          f"rollout.name = {config.rollout.name!r} returns none; use a rollout that does (vllm "
                          "with [rollout.vllm] log_probs = true, its default, or debug with [rollout.debug] "
                          f"log_probs = true) or set algorithm.rollout_correction.{key} = 'off'")
    warning = truncated_sampling_warning(config.rollout.top_p, config.rollout.top_k) if has else None
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
