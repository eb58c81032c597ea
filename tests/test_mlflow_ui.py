"""A user's view of a run: a real `mlflow server` on 127.0.0.1, its web UI in headless Chromium.

Needs `playwright` (pip) and a Chromium binary (Debian's `chromium` package, or playwright's own);
CI installs both (.ci/run). Where either is missing the test skips and says which.
"""

from __future__ import annotations

import os
import shutil

import pytest

pytest.importorskip("mlflow")
sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install playwright)")

from test_mlflow_tracker import MlflowServer, copy_store, empty_store, make_config  # noqa: E402,F401

from nanoverl_core.builtins.mlflow_tracker import make_tracker  # noqa: E402

CHROMIUM = os.environ.get("NANOVERL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)


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


def test_the_run_page_shows_the_reward_chart_in_the_training_view(tmp_path, empty_store, browser):  # noqa: F811
    server = MlflowServer(tmp_path / "server")
    server.root.mkdir()
    copy_store(empty_store, server.root / "db")
    server.start()
    try:
        run_dir = tmp_path / "runs" / "ui-demo"
        tracker = make_tracker(make_config(run_dir, uri=server.url), run_dir, None)
        for step in range(1, 6):
            tracker.log_metrics({"reward/mean": step / 10, "actor/pg_loss": 0.1 / step}, step)
        tracker.log_metrics({"val/reward/mean": 0.5}, 5)
        tracker.close(success=True)

        page = browser.new_page()
        page.goto(tracker.browse_hint())                       # the link the tracker prints at start and end
        assert "workflowType=machine_learning" in page.url
        # the run's charts, in sections by prefix: the reward chart is there and plots this run's metric
        page.get_by_text("ui-demo (reward/mean)").first.wait_for(timeout=60_000)
        assert page.get_by_text("val/reward", exact=True).count() >= 1
        # the model-training view: the run sits under "Runs", not the GenAI view's "Evaluation runs"
        assert page.get_by_text("Evaluation runs").count() == 0
        assert page.get_by_text("Runs", exact=True).count() >= 1
    finally:
        server.stop()
