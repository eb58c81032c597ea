"""Agents as rollouts: one agent program per row, its model calls served by the rollout engine.

With [agent] set, the trainer wraps the selected rollout (`rollout.name`: hf, vllm, debug, ...) in an
`AgentRollout`. Its `generate` (stage 3):

1. gives every row an episode: an id, a fresh `Transcript` (agents/transcript.py), its data row;
2. sends the episodes to the agent workers (agents/runner.py), which start one agent per episode, each
   with an OpenAI client pointed at this run's endpoint (agents/server.py) under its episode's URL;
3. serves their calls on this thread: a call is rendered to token ids when it arrives, and queued; once
   every agent still running waits on a call (or, with `agent.batch_window_ms` set, that long after the
   oldest queued call), the queued calls go to the engine as one batch (n rows for a call asking for n choices), each row
   continuing its episode's KV cache where the engine keeps one (`turn_cache`), and every call is
   answered in OpenAI's format: text, `tool_calls` parsed from the model's `<tool_call>`s, the engine's
   log-probs when asked;
4. when every agent has ended, builds the batch the trainer sees: one row per episode, with the
   columns of a multi-turn episode (nanoverl_core.env.episode): the model's tokens exactly as sampled
   (`model_mask` 1), everything else the endpoint rendered around them (0), the engine's log-probs, and
   the agent's reward (agent.reward_weight x the number it returned) on the row's last model token. The
   row's `prompts` (and `prompt_text`) are the first call's prompt, what the model actually read.
   An episode whose agent sent a call that does not extend its row (agents/transcript.py, `Split`) has
   one row per run of calls that merge, each from its first call's prompt: the rows follow one another
   in the batch, `episode_row` names the input row of each (the trainer repeats that row for them:
   rollout.rollout_rows), every row of the episode has its reward (the agent's on each row's last model
   token; [reward] scores the episode's last reply, `final_text`, on every row), and
   `episode/splits` counts the splits.

Sampling is the run's (rollout.temperature, top_p, top_k; rollout.val_* in validation): a request's own
temperature or top_p is counted (`episode/sampling_overridden/mean`) and not used, so the log-probs the
trainer computes are of the distribution that sampled. Each call's `max_tokens` is capped by what is left
of the row's budget (rollout.max_new_tokens, the model's and the rendered tokens together); a call with
no room left is answered at once with an empty completion, `finish_reason` "length".

An episode fails, with its kind, when its agent raises, runs past agent.timeout_s (`timeout`), returns
something that is not a reward (`invalid`), kills its worker (`crash`), never calls the model
(`no_calls`), calls it after it ended (`late`), more than agent.max_calls times (`flood`), with a
request the endpoint refuses (`refused`), or while another of its calls runs (`concurrent`):
agent.on_error = "raise" stops the run with one line, "zero" scores the row 0, counts the kind in
`episode/error_<kind>/rate` and writes it to reward_errors.jsonl.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections import Counter
from concurrent.futures import Future
from contextlib import nullcontext
from typing import Any

import attrs
import torch

from ..batch import RLBatch
from ..errors import EpisodeError, one_line
from ..processes import WorkerPool
from ..rollout import SamplingParams, stop_token_ids
from .runner import GRACE_S
from .source import AgentSource
from .transcript import (CallRefused, Choice, Split, Transcript, assistant_message, forced_opening,
                         uses_template_tools)

SEED_STRIDE = 1_000_003
"""Call c of a row seeded by a `sample_seed` column samples choice j with `sample_seed + c * SEED_STRIDE + j`."""
_PROBE_TOOL = [{"type": "function", "function": {"name": "probe", "description": "a probe",
                                                  "parameters": {"type": "object", "properties": {}}}}]


@attrs.define(eq=False)
class Episode:
    index: int
    """The row in the batch."""
    eid: str
    row: dict
    transcript: Transcript = attrs.Factory(Transcript)
    calls: int = 0
    outcome: dict | None = None
    """How the agent ended (agents/runner.py): {"kind", "reward" or "message", "info"}; None while it runs."""
    error: tuple[str, str] | None = None
    info: Counter = attrs.Factory(Counter)
    busy: bool = False
    """A call of the episode is being rendered, queued or sampled (a second one at once is refused)."""
    rows: list[Transcript] = attrs.Factory(list)
    """The rows the episode ended before `transcript`, the one its calls now extend (each split starts one)."""


@attrs.define(eq=False)
class Call:
    episode: Episode
    route: str
    prompt: list[int]
    n: int
    limit: int
    stop: list[str]
    tools: list[dict]
    logprobs: bool
    number: int
    token_ids: bool = False
    """Return the prompt's and each choice's token ids (vLLM's `return_token_ids`)."""
    forced: list[int] = attrs.Factory(list)
    opening: str = ""
    """The reply's start the endpoint writes to enforce tool_choice, and its ids (the prompt's last ones)."""
    future: Future = attrs.Factory(Future)
    queued: float = attrs.Factory(time.monotonic)


class AgentRollout:
    """A rollout (the `Rollout` protocol) whose rows are agent episodes (see the module docstring)."""

    def __init__(self, engine, source: AgentSource, config, tokenizer, model_name: str = "policy"):
        self.engine, self.source, self.tokenizer, self.model = engine, source, tokenizer, model_name
        self.cfg, self.budget = config.agent, config.rollout.max_new_tokens
        self.max_prompt = config.agent.max_prompt_tokens
        self.returns_log_probs = bool(getattr(engine, "returns_log_probs", False))
        own = getattr(engine, "eos_token_ids", None)
        self.stop_ids = list(own or stop_token_ids(tokenizer, getattr(engine, "module", None)))
        fmt = self.cfg.tool_format
        if fmt == "auto" and getattr(tokenizer, "chat_template", None):
            fmt = "template" if uses_template_tools(tokenizer, _PROBE_TOOL) else "hermes"
        self.tool_format = fmt
        """How tools reach the model: the chat template's own format, or Hermes' `<tool_call>` block."""
        self.key = secrets.token_urlsafe(24)
        self.lock = threading.Condition()
        self.episodes: dict[str, Episode] = {}
        self.pending: list[Call] = []
        self.params: SamplingParams | None = None
        self.ids = itertools.count()
        self.endpoint = self.pool = None

    def sync_weights(self, actor) -> None:
        self.engine.sync_weights(actor)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        if self.endpoint is not None:
            self.endpoint.close()
        self.engine.close()

    def _start(self) -> None:
        if self.endpoint is None:
            from .server import Endpoint
            self.endpoint = Endpoint(self, self.key)
            init = (self.source, self.cfg.settings, self.endpoint.url, self.key, self.cfg.timeout_s)
            self.pool = WorkerPool("nanoverl_core.agents.runner", init, self.cfg.workers, section="agent",
                                   what=self.source.label, error=EpisodeError)

    # ---- one batch of episodes ---------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, batch: RLBatch, params: SamplingParams) -> RLBatch:
        self._start()
        episodes = [Episode(i, f"{next(self.ids)}-{secrets.token_hex(4)}", batch["row"][i],
                            Transcript(budget=self.budget)) for i in range(len(batch))]
        with self.lock:
            self.params, self.episodes = params, {e.eid: e for e in episodes}
        self.pool.start()   # here, not on the runner thread: a worker gets SIGKILL when the thread that started it ends
        runner = threading.Thread(target=self._run_agents, args=(episodes,), name="nanoverl-agents", daemon=True)
        runner.start()
        awake = getattr(self.engine, "awake", nullcontext)
        turn_cache = getattr(self.engine, "turn_cache", nullcontext)
        try:
            with awake(), turn_cache():
                while (calls := self._next_calls(episodes, runner)) is not None:
                    try:
                        self._sample(batch, calls, params)
                    except BaseException:               # the engine failed: every call fails, the agents end
                        with self.lock:
                            self.episodes = {}
                            for call in calls:
                                if not call.future.done():
                                    call.future.set_exception(CallRefused(500, "engine_error", "the engine failed"))
                        raise
        finally:
            runner.join()
            with self.lock:
                self.episodes = {}
                for call in self.pending:            # a call that came with its episode's end: never sampled
                    call.future.set_exception(CallRefused(409, "episode_ended", "the episode has ended", "late"))
                self.pending = []
        return self._to_batch(batch, episodes)

    def _run_agents(self, episodes: list[Episode]) -> None:
        """On the runner thread: deal the episodes out to the (started) workers, wait for them, and end every
        episode of a worker that crashed or hung with that kind."""
        try:
            workers = list(self.pool.workers)
            groups = {w: [e for e in episodes[k::len(workers)]] for k, w in enumerate(workers)}
            keys = {}
            for k, (worker, group) in enumerate(groups.items()):
                if group and self.pool.send(worker, [(k, [(e.eid, e.row) for e in group])]):
                    keys[k] = group
                elif group:
                    self._end_all(group, {"kind": "crash", "message": "its worker process died before it started"})
            expired = f"the agent worker ran past agent.timeout_s={self.cfg.timeout_s:g}s + {GRACE_S:g}s"
            while self.pool.busy():
                for key, answer, _ in self.pool.wait(self.cfg.timeout_s + GRACE_S if self.cfg.timeout_s else 0, expired):
                    if isinstance(answer, tuple):    # the pool's (kind, message): crash or timeout
                        self._end_all(keys[key], {"kind": answer[0], "message": answer[1]})
            self._end_all(episodes, {"kind": "lost", "message": "its worker ended without reporting the agent's end"})
        except BaseException as exc:                  # the pool failed: every episode fails with it
            self._end_all(episodes, {"kind": "crash", "message": str(exc)})

    def _end_all(self, episodes: list[Episode], outcome: dict) -> None:
        with self.lock:
            for e in episodes:
                if e.outcome is None:
                    e.outcome = outcome
            self.lock.notify_all()

    def _next_calls(self, episodes: list[Episode], runner: threading.Thread) -> list[Call] | None:
        """The next calls to sample: every queued call once all agents still running wait on one (or, with a
        window, once the oldest has waited agent.batch_window_ms); None when every agent has ended."""
        window = self.cfg.batch_window_ms / 1000
        with self.lock:
            while True:
                live = [e for e in episodes if e.outcome is None]
                waited = time.monotonic() - self.pending[0].queued if self.pending else 0.0
                if self.pending and (all(e.transcript.in_flight for e in live) or (window and waited >= window)):
                    calls, self.pending = self.pending, []
                    return sorted(calls, key=lambda c: (c.episode.index, c.number))
                if not self.pending and not live and not runner.is_alive():
                    return None
                self.lock.wait(timeout=max(0.001, window - waited) if self.pending and window else 0.05)

    # ---- the endpoint's side (the server thread) ---------------------------------------------------------
    def ended(self, eid: str, outcome: dict) -> None:
        with self.lock:
            episode = self.episodes.get(eid)
            if episode is not None and episode.outcome is None:
                episode.outcome = outcome
                self.lock.notify_all()

    def submit(self, eid: str, route: str, body: dict) -> Future:
        """Check and render one call (outside the lock: its episode is reserved meanwhile), then queue it."""
        future: Future = Future()
        episode, reserved = None, False
        try:
            with self.lock:
                episode = self.episodes.get(eid)
                if episode is None:
                    raise CallRefused(404, "episode_not_found", f"no running episode {eid!r}: use the base URL the "
                                                                "agent was given, while its episode runs")
                if episode.outcome is not None:
                    raise CallRefused(409, "episode_ended", "the agent called the model after its episode ended",
                                      "late")
                if episode.busy:
                    raise CallRefused(400, "concurrent_call", "the agent sent a call while another call of its "
                                      "episode was running: an episode's calls follow one another (docs/agents.md, "
                                      "'What merges and what splits')", "concurrent")
                episode.busy = reserved = True
            call = self._call(episode, route, body)
        except Exception as exc:
            if not isinstance(exc, CallRefused):      # a template or tokenizer that fails on the request
                detail = one_line(exc)
                exc = CallRefused(400, "invalid_value", f"the request cannot be rendered for the model ({detail})")
            with self.lock:
                if episode is not None:
                    episode.busy = episode.busy and not reserved     # a refused call frees its episode
                    self._fault(episode, exc.kind, str(exc))
            future.set_exception(exc)
            return future
        with self.lock:
            if call.limit <= 0:                       # no room left in the row: an empty completion, at once
                episode.transcript.truncated, episode.busy = True, False
                future.set_result(self._response(call, [Choice([], [], "", {"role": "assistant", "content": ""}
                                                                if route == "chat" else None)], ["length"]))
                return future
            call.future = future
            episode.transcript.in_flight = True
            self.pending.append(call)
            self.lock.notify_all()
        return future

    def _fault(self, episode: Episode, kind: str, message: str) -> None:
        episode.info[f"error_{kind}"] = 1.0
        if episode.error is None:
            episode.error = (kind, message)

    def _call(self, episode: Episode, route: str, body: dict) -> Call:
        """A request checked and rendered to prompt ids (CallRefused for what the endpoint refuses)."""
        if episode.calls >= self.cfg.max_calls:
            raise CallRefused(429, "too_many_calls", f"more than agent.max_calls={self.cfg.max_calls} calls in one "
                                                     "episode", "flood")
        n = _int(body, "n", 1, 1, 16)
        max_tokens = _int(body, "max_completion_tokens", _int(body, "max_tokens", 0, 1), 1)
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
            raise CallRefused(400, "invalid_value", "stop must be a string or a list of up to 4 non-empty strings")
        if body.get("top_logprobs"):
            raise CallRefused(400, "unsupported_value", "top_logprobs is not served (the sampled tokens' log-probs are)")
        for key, ours in (("temperature", self.params.temperature), ("top_p", self.params.top_p)):
            if body.get(key) is not None and body[key] != ours:
                episode.info["sampling_overridden"] += 1.0
        prompt, tools, opening = self._prompt(episode, route, body)
        episode.calls += 1
        episode.info["calls"] += 1.0
        if len(episode.transcript.prompt) > self.max_prompt:
            raise CallRefused(400, "context_length_exceeded", f"the row's first prompt is "
                                                              f"{len(episode.transcript.prompt)} tokens, over "
                                                              f"agent.max_prompt_tokens={self.max_prompt}")
        forced = list(self.tokenizer.encode(opening, add_special_tokens=False)) if opening else []
        room = 0 if prompt is None else self.budget - len(episode.transcript.tokens) - len(forced)
        return Call(episode, route, (prompt or []) + forced, n, min(max_tokens or room, room), stop, tools,
                    bool(body.get("logprobs")), episode.calls - 1, bool(body.get("return_token_ids")), forced, opening)

    def _prompt(self, episode: Episode, route: str, body: dict) -> tuple[list[int] | None, list[dict], str]:
        """(the call's prompt ids, None when the row has no room left; its tools; the reply's forced opening)."""
        if route != "chat":
            text = body.get("prompt")
            if isinstance(text, str):
                ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            elif isinstance(text, list) and text and all(isinstance(i, int) for i in text):
                ids = text
            else:
                raise CallRefused(400, "invalid_value", "prompt must be a string or a list of token ids")
            try:
                return episode.transcript.completion_prompt(ids), [], ""
            except Split:
                return self._new_row(episode).completion_prompt(ids), [], ""
        messages, tools = body.get("messages"), body.get("tools") or []
        if not isinstance(messages, list) or not messages:
            raise CallRefused(400, "invalid_value", "messages must be a non-empty list of messages")
        if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("function"), dict)
                                                  and isinstance(t["function"].get("name"), str) for t in tools):
            raise CallRefused(400, "invalid_value", 'tools must be a list of {"type": "function", "function": '
                                                    '{"name": ..., "parameters": {...}}}')
        tools = [] if body.get("tool_choice") == "none" else tools
        opening = forced_opening(body.get("tool_choice"), tools)
        render = (self.tokenizer, messages, tools, self.tool_format, self.stop_ids)
        try:
            prompt = episode.transcript.chat_prompt(*render)
        except Split:
            prompt = self._new_row(episode).chat_prompt(*render)
        return prompt, tools, opening

    def _new_row(self, episode: Episode) -> Transcript:
        """Split the episode: its row ends with the completion its agent last got, and a new, empty one follows."""
        episode.transcript.commit()
        episode.rows.append(episode.transcript)
        episode.transcript = Transcript(budget=self.budget)
        episode.info["splits"] += 1.0
        return episode.transcript

    # ---- the engine's side (this thread) -----------------------------------------------------------------
    def _sample(self, batch: RLBatch, calls: list[Call], params: SamplingParams) -> None:
        rows = [(call, j) for call in calls for j in range(call.n)]
        width = max(len(call.prompt) for call in calls)
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (call, _) in enumerate(rows):
            ids[r, width - len(call.prompt):] = torch.tensor(call.prompt)
            mask[r, width - len(call.prompt):] = 1
        sub = batch.index([call.episode.index for call, _ in rows])
        sub["prompts"], sub["prompt_mask"] = ids, mask
        shared = len(rows) != len({call.episode.index for call, _ in rows})   # n > 1: no row continues a cache
        sub["episode_key"] = torch.tensor([-1 - r if shared else call.episode.index for r, (call, _) in enumerate(rows)])
        if "sample_seed" in sub:
            sub["sample_seed"] = sub["sample_seed"] + torch.tensor([c.number * SEED_STRIDE + j for c, j in rows])
        out = self.engine.generate(sub, attrs.evolve(params, max_new_tokens=max(c.limit for c in calls)))
        choices: dict[int, list[tuple[Choice, str, int]]] = {}
        for r, (call, j) in enumerate(rows):
            n = int(out["response_mask"][r].sum())
            got = out["responses"][r, :n].tolist()[:call.limit]
            lps = out["rollout_log_probs"][r, :len(got)].tolist() if "rollout_log_probs" in out else []
            choices.setdefault(id(call), []).append(self._choice(call, got, lps))
        with self.lock:
            for call in calls:
                made, finishes, bad = zip(*choices[id(call)])
                call.episode.transcript.choices = list(made)
                call.episode.transcript.in_flight = call.episode.busy = False
                call.episode.info["malformed_calls"] += float(sum(bad))
                call.future.set_result(self._response(call, list(made), list(finishes)))
            self.lock.notify_all()

    def _choice(self, call: Call, ids: list[int], log_probs: list[float]) -> tuple[Choice, str, int]:
        """A sampled completion cut at the first stop string, as a Choice with its reply; its finish_reason;
        how many malformed tool calls it held."""
        text, finish = self.tokenizer.decode(ids, skip_special_tokens=True), "length"
        if ids and ids[-1] in self.stop_ids:
            finish = "stop"
        for k in range(1, len(ids) + 1) if call.stop else ():
            part = self.tokenizer.decode(ids[:k], skip_special_tokens=True)
            at = min((part.find(s) for s in call.stop if s in part), default=-1)
            if at >= 0:
                ids, log_probs, text, finish = ids[:k], log_probs[:k], part[:at], "stop"
                break
        message, bad = None, 0
        if call.route == "chat":
            message, bad = assistant_message(call.opening + text, call.tools, f"call_{call.episode.eid}_{call.number}")
            if message.get("tool_calls"):
                finish = "tool_calls"
        return Choice(ids, list(log_probs), text, message, call.forced), finish, bad

    def _response(self, call: Call, choices: list[Choice], finishes: list[str]) -> dict[str, Any]:
        out = []
        for k, (choice, finish) in enumerate(zip(choices, finishes)):
            logprobs = None
            if call.logprobs and self.returns_log_probs:          # the sampled tokens' own, in either API's shape
                tokens = [self.tokenizer.decode([i]) for i in choice.ids]
                logprobs = ({"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                                         for t, lp in zip(tokens, choice.log_probs)]} if call.route == "chat" else
                            {"tokens": tokens, "token_logprobs": choice.log_probs, "top_logprobs": None,
                             "text_offset": None})
            item = {"index": k, "finish_reason": finish, "logprobs": logprobs}
            item.update({"message": choice.message} if call.route == "chat" else {"text": choice.text})
            if call.token_ids:
                item.update(token_ids=choice.ids, **({} if call.route == "chat" else {"prompt_token_ids": call.prompt}))
            out.append(item)
        used = sum(len(c.ids) for c in choices)
        response = {"id": f"{call.route}-{call.episode.eid}-{call.number}", "created": int(time.time()),
                    "model": self.model, "object": "chat.completion" if call.route == "chat" else "text_completion",
                    "choices": out, "usage": {"prompt_tokens": len(call.prompt), "completion_tokens": used,
                                              "total_tokens": len(call.prompt) + used}}
        if call.token_ids:
            response["prompt_token_ids"] = call.prompt
        return response

    # ---- the batch the trainer sees ----------------------------------------------------------------------
    def _settle(self, batch: RLBatch, episodes: list[Episode]) -> None:
        """Close every episode's row: its last call's completion joins it, and how its agent ended becomes its
        fault, if any; with agent.on_error = "raise" the first fault stops the run."""
        for e in episodes:
            e.transcript.commit()
            outcome = e.outcome or {"kind": "lost", "message": "the agent never reported its end"}
            if outcome["kind"] != "ok":
                self._fault(e, outcome["kind"], outcome.get("message", ""))
            elif e.calls == 0:
                self._fault(e, "no_calls", "the agent never called the model")
            e.info.update(outcome.get("info") or {})
        failed = next((e for e in episodes if e.error is not None), None)
        if failed is not None and self.cfg.on_error == "raise":
            raise EpisodeError(f"agent {self.source.label!r} on data row {batch['index'][failed.index]}: "
                               f"{failed.error[0]}: {failed.error[1]}; fix the agent, or set agent.on_error=zero "
                               "to score such rows 0")

    def _to_batch(self, batch: RLBatch, episodes: list[Episode]) -> RLBatch:
        self._settle(batch, episodes)
        rows = [(e, t) for e in episodes for t in (*e.rows, e.transcript)]   # an episode's rows in order
        prompts = [t.prompt or batch["prompts"][e.index][batch["prompt_mask"][e.index].bool()].tolist()
                   for e, t in rows]
        width, plen = max(1, max(len(t.tokens) for _, t in rows)), max(len(p) for p in prompts)
        shape = (len(rows), width)
        ids = torch.full(shape, self.tokenizer.pad_token_id, dtype=torch.long)
        pids = torch.full((len(rows), plen), self.tokenizer.pad_token_id, dtype=torch.long)
        pmask = torch.zeros((len(rows), plen), dtype=torch.long)
        response_mask, model_mask, log_probs, rewards = (torch.zeros(shape) for _ in range(4))
        for row, ((e, t), prompt) in enumerate(zip(rows, prompts)):
            n = len(t.tokens)
            pids[row, plen - len(prompt):], pmask[row, plen - len(prompt):] = torch.tensor(prompt), 1
            ids[row, :n] = torch.tensor(t.tokens, dtype=torch.long)
            response_mask[row, :n] = 1.0
            model_mask[row, :n] = torch.tensor(t.model, dtype=torch.float32)
            log_probs[row, :n] = torch.tensor(t.log_probs, dtype=torch.float32)
            last = max((k for k, m in enumerate(t.model) if m), default=None)
            reward = (e.outcome or {}).get("reward")
            if e.error is None and reward is not None and last is not None:
                rewards[row, last] = reward * self.cfg.reward_weight
        label = self.source.label
        final = {e.eid: next((turn["text"] for t in (e.transcript, *reversed(e.rows)) for turn in reversed(t.turns)
                              if turn["role"] == "model"), "") for e in episodes}
        error = {e.eid: None if e.error is None else
                 f"{e.error[0]}: agent {label!r} on data row {batch['index'][e.index]}: {e.error[1]}" for e in episodes}
        out = RLBatch({"prompts": pids, "prompt_mask": pmask, "responses": ids, "response_mask": response_mask,
                       "model_mask": model_mask, "turn_rewards": rewards,
                       "truncated": torch.tensor([t.truncated for _, t in rows]),
                       "num_turns": torch.tensor([sum(turn["role"] == "model" for turn in t.turns) for _, t in rows]),
                       "episode_failed": torch.tensor([e.error is not None for e, _ in rows]),
                       "episode_row": torch.tensor([e.index for e, _ in rows])},
                      {"prompt_text": [self.tokenizer.decode(p) for p in prompts],   # what the model read
                       "final_text": [final[e.eid] for e, _ in rows],                 # the episode's last reply
                       "episode": [t.turns for _, t in rows],
                       "episode_info": [dict(e.info) for e, _ in rows],
                       "episode_error": [error[e.eid] if t is e.transcript else None for e, t in rows]})
        if self.returns_log_probs:
            out["rollout_log_probs"] = log_probs
        return out


def _int(body: dict, key: str, default: int, low: int, high: int | None = None) -> int:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        raise CallRefused(400, "invalid_value", f"{key} must be an integer from {low}"
                                                f"{f' to {high}' if high is not None else ''}, got {value!r}")
    return value

