"""A user's view of a run: a real `tensorboard` server on 127.0.0.1, its scalars page in headless Chromium.

A short real training run writes its event files; `tensorboard --logdir <the runs' folder>` serves them; the
page must list the run and draw the charts under the trainer's metric keys. The screenshot is written to
$NANOVERL_SCREENSHOTS (docs/images/tensorboard-scalars.png was taken this way:
`NANOVERL_SCREENSHOTS=docs/images pytest plugins/nanoverl-tensorboard/tests/test_tensorboard_ui.py`), else
into the test's tmp folder.

Needs `playwright` (pip) and a Chromium binary (Debian's `chromium` package, or playwright's own); CI
installs both (.ci/run). Where either is missing the test skips and says which.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")
sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install playwright)")

ROOT = Path(__file__).resolve().parents[3]
REINFORCE = str(ROOT / "examples" / "configs" / "debug_reinforce.toml")
CHROMIUM = os.environ.get("NANOVERL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def browser():
    with sync_api.sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        except Exception as exc:
            pytest.skip(f"no Chromium to drive (apt install chromium, or playwright install chromium): "
                        f"{str(exc).splitlines()[0]}")
        yield browser
        browser.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def tensorboard_server(tmp_path):
    """start(logdir) -> the server's URL, once it answers; stopped after the test."""
    procs = []

    def start(logdir: Path) -> str:
        port = free_port()
        log = (tmp_path / "tensorboard.log").open("w")
        procs.append(subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
                                       "--host", "127.0.0.1", "--port", str(port)],
                                      stdout=log, stderr=subprocess.STDOUT))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert procs[-1].poll() is None, (tmp_path / "tensorboard.log").read_text()
            try:
                with urllib.request.urlopen(f"{url}/data/runs", timeout=5):
                    return url
            except OSError:
                time.sleep(0.2)
        pytest.fail(f"tensorboard did not answer on {url}: {(tmp_path / 'tensorboard.log').read_text()[-2000:]}")

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_scalars_page_draws_the_runs_charts_under_the_trainer_keys(tmp_path, browser, tensorboard_server):
    runs = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "nanoverl_core.cli", "--config", REINFORCE, "trainer.progress=none",
                           "trainer.total_steps=20", "trainer.val_every=5", "data.batch_size=8", "rollout.n=4",
                           f"trainer.output_dir={runs / 'debug-reinforce'}", "tracking.trackers=[tensorboard]"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr
    url = tensorboard_server(runs)                        # a folder above the run: the runs side by side
    with urllib.request.urlopen(f"{url}/data/runs") as answer:
        assert answer.read().decode() == '["debug-reinforce/tensorboard"]'

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{url}/#scalars")
    page.get_by_text("actor/pg_loss", exact=True).first.wait_for(timeout=90_000)  # a chart's title
    assert page.get_by_text("debug-reinforce/tensorboard", exact=True).first.is_visible()  # the runs list
    assert page.get_by_text("tag: actor/entropy", exact=True).first.is_visible()
    lines = page.locator("path.line")                     # the charts' plotted lines (an SVG path per chart)
    deadline = time.monotonic() + 60
    while lines.count() < 5 and time.monotonic() < deadline:  # the "actor" section's five charts draw first
        time.sleep(0.2)
    assert lines.count() >= 5
    assert all(len(lines.nth(i).get_attribute("d") or "") > 20 for i in range(5))  # a polyline, not an empty path
    # the other sections, one per metric prefix, in TensorBoard's order
    for section in ("reward", "rollout", "timing", "val"):
        assert page.get_by_text(section, exact=True).count() >= 1, section

    out = Path(os.environ.get("NANOVERL_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out / "tensorboard-scalars.png"))
    assert (out / "tensorboard-scalars.png").stat().st_size > 10_000
