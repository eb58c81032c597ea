"""The adapter against OpenEnv's own server (uvicorn serving the fixture game's `create_app` app on 127.0.0.1):
episodes are WebSocket sessions through OpenEnv's GenericEnvClient, and every fault is a raise within a
timeout, never a hang and never a silently fresh session; the server the plugin starts itself for `app`."""

from __future__ import annotations

import random
import subprocess
import sys
import time

import pytest

from conftest import GAME, alive
from nanoverl_core.env import EnvStep, Turn
from nanoverl_openenv.episode import openenv_episode
from nanoverl_openenv.server import StartedServer
from nanoverl_openenv.settings import OpenEnvSettings


def secret(seed: int) -> int:
    return random.Random(seed).randrange(10)


def turn(text: str, index: int = 0) -> Turn:
    return Turn(text, (), index)


def test_interleaved_episodes_are_separate_sessions_with_separate_state(serve):
    """Two episodes held by one process, stepped in turn: each game keeps its own secret and guess count on
    the server, as the episodes of one environment worker do."""
    server = serve()
    settings = OpenEnvSettings(url=server.url, role="")
    seeds = [s for s in range(50) if secret(s) not in (0, 9)]
    a_seed, b_seed = seeds[0], next(s for s in seeds if secret(s) != secret(seeds[0]))
    a = openenv_episode({"reset": {"seed": a_seed, "max_guesses": 3}}, settings)
    b = openenv_episode({"reset": {"seed": b_seed, "max_guesses": 2}}, settings)
    assert a.first["observation"]["hint"] == "3?" and b.first["observation"]["hint"] == "2?"
    answers = [a.step(turn(str(secret(b_seed)))), b.step(turn(str(secret(a_seed)))),   # each the other's secret
               a.step(turn("x", 1)), b.step(turn(str(secret(b_seed)), 1))]
    assert [s.observation for s in answers] == [
        "+" if secret(b_seed) < secret(a_seed) else "-", "+" if secret(a_seed) < secret(b_seed) else "-", "?", "="]
    assert [(s.reward, s.done) for s in answers] == [(0.1, False), (0.1, False), (0.0, False), (1.0, True)]
    assert a.step(turn(str(secret(a_seed)), 2)) == EnvStep(observation="=", reward=1.0, done=True)
    a.close()
    b.close()


def test_an_environment_that_raises_on_the_server_is_a_raise_with_its_message(serve):
    server = serve()
    episode = openenv_episode({"reset": {"seed": 0}}, OpenEnvSettings(url=server.url))
    with pytest.raises(RuntimeError, match=r"turn 0: RuntimeError: Server error: the guess '!' blew up"):
        episode.step(turn("!"))
    assert episode.step(turn(str(secret(0)), 1)).done                  # the session goes on (the model's turn)
    episode.close()


def test_a_hung_server_times_out_and_the_session_is_never_reopened(serve):
    server = serve()
    episode = openenv_episode({"reset": {"seed": 0}}, OpenEnvSettings(url=server.url, message_timeout_s=1))
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="turn 0: TimeoutError"):
        episode.step(turn("~"))                                        # the game sleeps 30 s
    assert time.monotonic() - start < 5
    with pytest.raises(RuntimeError, match="WebSocket session is closed"):
        episode.step(turn("1", 1))                                     # not a fresh, never-reset session
    episode.close()


def test_a_websocket_that_drops_mid_episode_fails_it_even_when_a_server_is_back(serve):
    """The server is killed mid-episode and a new one starts on the same port: OpenEnv's client would reconnect
    to a new environment that was never reset; the episode fails instead, and a new episode works."""
    server = serve()
    settings = OpenEnvSettings(url=server.url, message_timeout_s=5)
    episode = openenv_episode({"reset": {"seed": 3}}, settings)
    episode.step(turn("x"))
    server.kill()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="turn 1: "):
        episode.step(turn("x", 1))
    assert time.monotonic() - start < 5
    serve(port=server.port)                                            # back, on the same port
    with pytest.raises(RuntimeError, match="WebSocket session is closed"):
        episode.step(turn("x", 2))
    episode.close()
    fresh = openenv_episode({"reset": {"seed": 3}}, settings)
    assert fresh.step(turn(str(secret(3)))).done
    fresh.close()


def test_a_server_that_is_down_fails_the_episodes_start_quickly(serve):
    server = serve()
    settings = OpenEnvSettings(url=server.url, connect_timeout_s=2)    # checked while it is up
    server.kill()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=f"OpenEnv server {server.url}, connect: ConnectionError"):
        openenv_episode({"reset": {"seed": 0}}, settings)
    assert time.monotonic() - start < 5


def test_the_plugin_serves_an_app_on_loopback_and_starts_it_again_after_it_died(tmp_path):
    started = StartedServer(f"{GAME}:app", start_timeout_s=60)
    try:
        url = started.url()
        assert url.startswith("http://127.0.0.1:") and started.url() == url   # one server, kept
        settings = OpenEnvSettings(url=url)
        assert openenv_episode({"reset": {"seed": 2}}, settings).step(turn(str(secret(2)))).done
        first = started.proc.pid
        started.proc.kill()
        started.proc.wait()
        again = started.url()
        assert started.proc.pid != first and alive(started.proc.pid)
        assert openenv_episode({"reset": {"seed": 2}}, OpenEnvSettings(url=again)).step(turn("5")).observation
    finally:
        started.stop()
    assert not alive(started.proc.pid)


def test_an_app_that_cannot_serve_is_one_message_with_its_output(tmp_path):
    broken = tmp_path / "broken_app.py"
    broken.write_text(f"import runpy\napp = runpy.run_path({str(GAME)!r})['app']\nraise SystemExit('no port today')\n")
    with pytest.raises(RuntimeError, match="exited with status 1 before it answered: .*no port today"):
        StartedServer(f"{broken}:app", start_timeout_s=60).url()


def test_a_started_server_dies_with_the_process_that_started_it():
    """A worker SIGKILLed for a timeout or a crash takes its server with it (PR_SET_PDEATHSIG, the parent watch)."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom nanoverl_openenv.server import "
                               f"StartedServer\ns = StartedServer({f'{GAME}:app'!r}, 60)\ns.url()\n"
                               "print(s.proc.pid, flush=True)\ntime.sleep(120)\n"], stdout=subprocess.PIPE, text=True)
    try:
        server = int(holder.stdout.readline())
        assert alive(server)
    finally:
        holder.kill()
        holder.wait()
    assert not alive(server, wait_s=5)
