"""Settings of the `judge` reward, written as [reward.judge], and the checks a run (and --dry-run) makes first.

Kept apart from the reward (no httpx or torch import), so checking a config stays fast.
"""

from __future__ import annotations

import json
import os
import re
import string
import urllib.error
import urllib.request
from pathlib import Path
from typing import Literal

import attrs

from nanoverl_core.config import at_least, finite
from nanoverl_core.errors import ConfigError

KNOWN_FIELDS = ("prompt", "response", "ground_truth", "responses", "n")
"""Template fields the judge fills in itself; any other field is a data row's (`{extra_info[answer]}` reads
into a nested one)."""

POINTWISE_TEMPLATE = """You are grading an answer to a question against the reference answer.

Question: {prompt}
Reference answer: {ground_truth}
Answer to grade: {response}

Give 10 if the answer to grade says the same as the reference answer, 0 if it does not. Reply with one line of the form "Score: N"."""
"""The rubric of mode = "pointwise" when `template` and `template_file` are empty."""

GROUP_TEMPLATE = """You are grading {n} answers to one question against the reference answer.

Question: {prompt}
Reference answer: {ground_truth}

{responses}

Give each answer 10 if it says the same as the reference answer, 0 if it does not. Reply with one line per answer of the form "Score i: N"."""
"""The rubric of mode = "group" (RULER's way: every answer of a group in one request, scored side by side)."""

POINTWISE_PATTERN = r"Score\s*:\s*(-?\d+(?:\.\d+)?)"
GROUP_PATTERN = r"Score\s*(\d+)\s*:\s*(-?\d+(?:\.\d+)?)"


def _pattern(groups: tuple[int, ...]):
    def check(_instance, attribute, value: str) -> None:
        if not value:
            return
        try:
            compiled = re.compile(value)
        except re.error as exc:
            raise ValueError(f"'{attribute.name}' = {value!r} is not a regular expression ({exc})") from None
        if compiled.groups not in groups:
            raise ValueError(f"'{attribute.name}' = {value!r} has {compiled.groups} groups; it needs "
                             f"{' or '.join(map(str, groups))} (see docs/rewards.md, the judge)")
    return check


def _env_name(_instance, attribute, value: str) -> None:
    if value and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise ValueError(f"'{attribute.name}' = {value!r} is not an environment variable's name; name the "
                         "variable that holds the key (e.g. OPENAI_API_KEY), never the key itself")


@attrs.define
class JudgeSettings:
    base_url: str = ""
    """The judge's OpenAI-compatible base URL, up to /v1 (`http://127.0.0.1:8000/v1` for a `vllm serve`); the
    reward posts to <base_url>/chat/completions. Empty when `serve` names a local model."""
    model: str = ""
    """The model name sent in every request (part of the cache key); with `serve`, empty sends "local"."""
    api_key_env: str = attrs.field(default="", validator=_env_name)
    """The name of the environment variable holding the API key, sent as `Authorization: Bearer <key>`; the
    key itself is never written to the run directory, the log, the cache or the trackers. Empty: no key."""
    serve: str = ""
    """A local Hugging Face model folder (config, weights, tokenizer with a chat template) that the reward
    serves itself on 127.0.0.1 (nanoverl_judge.server: greedy `generate`) from the batched-reward worker, for
    the run's length; `base_url` is then that server's."""
    serve_batch_size: int = attrs.field(default=8, validator=at_least(1))
    """With `serve`: requests the local server decodes together in one padded `generate`."""
    template: str = ""
    """The rubric as inline text with {fields}: {prompt} (the row's prompt: its text, or a chat prompt's last
    user message), {response}, {ground_truth} (the row's, as the built-in rewards find it), in mode "group"
    {responses} (every answer, numbered "Answer i:") and {n}, and any field of the data row
    ({extra_info[answer]} reads a nested one). Empty: `template_file`, else the mode's built-in rubric."""
    template_file: str = ""
    """The rubric in a text file (instead of `template`)."""
    system: str = ""
    """A system message sent before the rubric (none when empty)."""
    mode: Literal["pointwise", "group"] = "pointwise"
    """"pointwise": one request per distinct (rubric, response); "group": one request per group of rows
    sharing a uid (the rollout.n samples of one prompt), every answer in it, a score each (RULER)."""
    score_pattern: str = attrs.field(default="", validator=_pattern((1, 2)))
    """A regular expression reading the score out of the reply. Pointwise: one group, the number; the last
    match counts (default `Score\\s*:\\s*(-?\\d+(?:\\.\\d+)?)`). Group: two groups, the answer's number i and
    its score; each i of 1..n must appear, the last match of each counts (default
    `Score\\s*(\\d+)\\s*:\\s*(-?\\d+(?:\\.\\d+)?)`). No match, or a number outside [min_score, max_score]:
    the row fails as judge_unparsable."""
    min_score: float = attrs.field(default=0.0, validator=finite())
    """The lowest score the rubric asks for."""
    max_score: float = attrs.field(default=10.0, validator=finite())
    """The highest score the rubric asks for."""
    normalize: bool = True
    """Map the judge's score to (score - min_score) / (max_score - min_score), in [0, 1]; false: as given."""
    concurrency: int = attrs.field(default=8, validator=at_least(1))
    """Requests in flight at once."""
    timeout_s: float = attrs.field(default=60.0, validator=at_least(0.001))
    """Seconds one request may take (connect, send, wait, read); past it the attempt fails as judge_timeout."""
    retries: int = attrs.field(default=2, validator=at_least(0))
    """Further attempts after a timeout, an unreachable server, HTTP 408, 429 or 5xx (waiting 0.5 s, 1 s, 2 s,
    ... up to 8 s between them); any other HTTP status and an unparsable reply are not retried."""
    temperature: float = attrs.field(default=0.0, validator=at_least(0))
    """Sampling temperature of the judge (0: greedy, so a cached reply is the reply)."""
    max_tokens: int = attrs.field(default=256, validator=at_least(1))
    """Tokens the judge may write per reply."""
    cache: bool = True
    """Keep every reply with HTTP 200 in a cache keyed by the sha256 of the exact request JSON (model, messages,
    sampling): a repeated request is answered from it, so a resumed or repeated run asks nothing twice."""
    cache_path: str = ""
    """The cache file (sqlite); empty: <run directory>/judge/cache.sqlite (no cache outside a run)."""
    log: bool = True
    """Append every request and its reply (exact JSON, the score, the failure kind, cached or not, the rows'
    step, index and uid) to <run directory>/judge/requests.jsonl."""
    fallback: str = ""
    """What scores a row the judge failed on: a registered reward name ("exact_match") or "file.py:function"
    (called like reward.file's function). Empty: the row fails with its kind (judge_timeout, judge_http,
    judge_unreachable, judge_unparsable) and reward.on_error decides (raise, zero, drop)."""
    prompt_key: str = "prompt"
    """The data-row field holding the prompt that {prompt} renders."""

    def __attrs_post_init__(self) -> None:
        if not (self.max_score > self.min_score):
            raise ValueError(f"'max_score' = {self.max_score:g} must be above 'min_score' = {self.min_score:g}")
        if self.template and self.template_file:
            raise ValueError("'template' and 'template_file' are both set; keep one")


def judge_settings(config) -> JudgeSettings | None:
    """The [reward.judge] settings of `config` (with [[reward.components]], the judge component's)."""
    settings = config.reward.settings
    if config.reward.components:
        return settings.get("judge") if isinstance(settings, dict) else None
    return settings if isinstance(settings, JudgeSettings) else None


def template_text(settings: JudgeSettings) -> str:
    """The rubric: `template`, the text of `template_file`, or the mode's built-in one."""
    if settings.template:
        return settings.template
    if settings.template_file:
        return Path(settings.template_file).read_text()
    return GROUP_TEMPLATE if settings.mode == "group" else POINTWISE_TEMPLATE


def template_fields(text: str) -> list[str]:
    """The top-level names of the {fields} in `text` ({extra_info[answer]} -> extra_info)."""
    names = []
    for _, field, _, _ in string.Formatter().parse(text):
        if field is not None:
            names.append(re.split(r"[.\[]", field, maxsplit=1)[0])
    return list(dict.fromkeys(names))


def check_config(config) -> None:
    """The judge's settings before the run directory is written or a model loads (--dry-run too): the template
    parses and its fields are known names or fields of the data rows; the key's variable is set; the fallback
    resolves; the served model folder exists, or the judge URL answers."""
    settings = judge_settings(config)
    if settings is None:
        return
    _check_template(settings, config)
    if settings.api_key_env and not os.environ.get(settings.api_key_env):
        raise ConfigError(f"reward.judge.api_key_env = {settings.api_key_env!r} but that environment variable is "
                          "not set (or empty); export it before the run")
    if settings.fallback:
        _check_fallback(settings.fallback)
    if settings.serve:
        if not (Path(settings.serve) / "config.json").is_file():
            raise ConfigError(f"reward.judge.serve = {settings.serve!r} is not a model folder (no config.json); name "
                              "a local Hugging Face causal LM folder, or set base_url instead")
    elif not settings.base_url:
        raise ConfigError("reward.judge needs base_url (an OpenAI-compatible URL up to /v1) or serve (a local model "
                          "folder); set one")
    else:
        check_reachable(settings)


def _check_template(settings: JudgeSettings, config) -> None:
    if settings.template_file and not Path(settings.template_file).is_file():
        raise ConfigError(f"reward.judge.template_file = {settings.template_file!r} does not exist; check the path")
    text = template_text(settings)
    try:
        fields = template_fields(text)
    except ValueError as exc:
        raise ConfigError(f"reward.judge template does not parse ({exc}); write fields as {{name}} and a literal "
                          "brace as {{ or }}") from None
    if settings.mode == "group" and "responses" not in fields:
        raise ConfigError("reward.judge.mode = 'group' but the template has no {responses} field; add it")
    if settings.mode == "pointwise" and "response" not in fields:
        raise ConfigError("reward.judge.mode = 'pointwise' but the template has no {response} field; add it")
    if settings.mode == "pointwise" and {"responses", "n"} & set(fields):
        raise ConfigError("reward.judge template has {responses} or {n}, which only mode = 'group' fills in; set "
                          "mode = 'group' or use {response}")
    row = first_row(config)
    unknown = [f for f in fields if f not in KNOWN_FIELDS and row is not None and f not in row]
    if unknown:
        raise ConfigError(f"reward.judge template field {{{unknown[0]}}} is neither one the judge fills in "
                          f"({', '.join(KNOWN_FIELDS)}) nor a field of the data rows (the first row has "
                          f"{', '.join(sorted(k for k in row if not k.startswith('__')))}); fix the template")
    if "ground_truth" in fields and row is not None:
        from nanoverl_core.reward import ground_truth_value
        from nanoverl_core.errors import RewardError
        try:
            ground_truth_value(row)
        except RewardError:
            raise ConfigError("reward.judge template has {ground_truth} but the data rows have no ground truth "
                              "(reward_model.ground_truth, ground_truth, target or answer); drop the field or "
                              "add one") from None


def first_row(config) -> dict | None:
    """The first row of data.train_files (a .jsonl read by hand, else through `datasets`), or None (a data
    source that generates rows, or no files)."""
    if config.data.source != "files" or not config.data.train_files:
        return None
    path = Path(config.data.train_files[0])
    if not path.is_file():
        return None  # the core's data checks name a missing file
    if path.suffix == ".jsonl":
        with path.open() as f:
            for line in f:
                if line.strip():
                    try:
                        return json.loads(line)
                    except json.JSONDecodeError:
                        return None
        return None
    from nanoverl_core.data import read_rows
    rows = read_rows([str(path)], "data.train_files")
    return rows[0] if rows else None


def _check_fallback(fallback: str) -> None:
    if ":" in fallback:
        file, function = fallback.rsplit(":", 1)
        if not Path(file).is_file():
            raise ConfigError(f"reward.judge.fallback = {fallback!r}: {file} does not exist; name a .py file and a "
                              "function in it (file.py:function), or a registered reward")
        if not re.search(rf"^\s*(async\s+)?def\s+{re.escape(function)}\s*\(", Path(file).read_text(), re.M):
            raise ConfigError(f"reward.judge.fallback = {fallback!r}: {file} defines no function {function!r}; "
                              "name one it defines")
        return
    from nanoverl_core import load_registry
    load_registry().entry("reward", fallback, "reward.judge.fallback")
    if fallback == "judge":
        raise ConfigError("reward.judge.fallback = 'judge' would ask the judge again; name another reward")


def check_reachable(settings: JudgeSettings) -> None:
    """GET <base_url>/models answers within 10 s (any HTTP status counts as reachable: a hosted API may refuse
    the listing to a key it accepts for completions); a ConfigError naming the URL otherwise."""
    url = settings.base_url.rstrip("/") + "/models"
    headers = {}
    if settings.api_key_env and os.environ.get(settings.api_key_env):
        headers["Authorization"] = f"Bearer {os.environ[settings.api_key_env]}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10):
            return
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise ConfigError(f"reward.judge.base_url = {settings.base_url!r} is not reachable (GET {url}: {reason}); "
                          "start the judge server or fix the URL") from None
