"""A user's view of a run: a real `mlflow server` on 127.0.0.1, its web UI in headless Chromium.

The printed link must open the model-training view, with the training reward and the held-out reward as
the first charts (MLflow sorts chart sections by metric prefix; docs/mlflow.md, "The first charts").

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

from nanoverl_mlflow.tracker import make_tracker  # noqa: E402

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


def trainer_step(step: int) -> dict[str, float]:
    """A few keys of every prefix a PPO step writes to metrics.jsonl."""
    return {"actor/entropy": 2.5 - step / 10, "actor/pg_loss": 0.1 / step, "actor/grad_norm": 0.5,
            "advantages/mean": 0.01, "critic/vf_loss": 0.2 / step, "critic/values/mean": 0.3,
            "reward/mean": step / 10, "reward/std": 0.1, "reward/errors": 0.0,
            "rollout/response_length/mean": 100.0 + step, "rollout/prompt_length/mean": 50.0,
            "rollout_corr/kl_k1": 0.001, "throughput/tokens_per_s": 1e4, "timing/rollout": 0.5, "timing/step": 1.0}


LAYOUT_JS = """() => {
  const box = (el) => { const r = el.getBoundingClientRect(); return {top: r.top + window.scrollY, left: r.left}; };
  const lines = (el) => (el.innerText || "").split("\\n").map((line) => line.trim());
  const sel = (id) => [...document.querySelectorAll(`[data-testid="${id}"]`)];
  return {sections: sel("experiment-view-compare-runs-section-header").map(
            (el) => ({name: lines(el)[0], count: lines(el)[1], ...box(el)})),
          charts: sel("experiment-view-compare-runs-card").map((el) => ({title: lines(el)[0], ...box(el)}))};
}"""


def layout(page, *legends: str) -> tuple[dict[str, str], list[dict]]:
    """Once the charts with these legends are drawn: the section headers top to bottom ({name: "(charts)"}),
    and the charts drawn so far in reading order (MLflow draws a chart once it is scrolled into view)."""
    for legend in legends:
        try:
            page.get_by_text(legend, exact=True).first.wait_for(timeout=90_000)
        except sync_api.TimeoutError:
            headers = sorted(page.evaluate(LAYOUT_JS)["sections"], key=lambda s: s["top"])
            pytest.fail(f"no chart {legend!r} in view; sections top to bottom: {[s['name'] for s in headers]}")
    found = page.evaluate(LAYOUT_JS)
    sections = {s["name"]: s["count"] for s in sorted(found["sections"], key=lambda s: s["top"])}
    return sections, sorted(found["charts"], key=lambda c: (c["top"], c["left"]))


def test_the_run_page_opens_in_the_training_view_with_the_reward_charts_first(tmp_path, empty_store,  # noqa: F811
                                                                               browser):
    server = MlflowServer(tmp_path / "server")
    server.root.mkdir()
    copy_store(empty_store, server.root / "db")
    server.start()
    try:
        run_dir = tmp_path / "runs" / "ui-demo"
        tracker = make_tracker(make_config(run_dir, uri=server.url), run_dir, None)
        for step in (1, 2):
            tracker.log_metrics(trainer_step(step), step)

        page = browser.new_page()                              # 1280x720, a laptop's window
        page.goto(tracker.browse_hint())                       # the link the tracker prints at start and end
        assert "workflowType=machine_learning" in page.url
        # the model-training view: the run sits under "Runs", not the GenAI view's "Evaluation runs"
        sections, charts = layout(page, "ui-demo (_headline/reward_mean)")
        assert page.get_by_text("Evaluation runs").count() == 0
        assert page.get_by_text("Runs", exact=True).count() >= 1
        # MLflow orders sections by name; the headline copy's section comes first, the trainer's follow
        names = list(sections)
        assert names[0] == "_headline" and {"actor", "critic", "reward", "timing"} <= set(names)
        assert names.index("actor") < names.index("reward")   # why the headline copies exist
        assert charts[0]["title"] == "reward_mean" and charts[0]["top"] < page.viewport_size["height"] / 2

        # validation runs at a later step; the page (its layout kept in the browser) is opened again
        for step in (3, 4):
            tracker.log_metrics(trainer_step(step), step)
        tracker.log_metrics({"val/reward/mean": 0.5, "val/reward/best@4": 0.75}, 4)
        tracker.close(success=True)
        page.reload()
        sections, charts = layout(page, "ui-demo (_headline/reward_mean)", "ui-demo (_headline/val_reward_mean)")
        names = list(sections)
        assert names[0] == "_headline" and names.index("val/reward") > names.index("timing")
        assert sections["_headline"] == "(2)" and sections["val/reward"] == "(2)" and sections["reward"] == "(3)"
        first, second, *rest = charts
        assert (first["title"], second["title"]) == ("reward_mean", "val_reward_mean")
        assert first["top"] == second["top"] < page.viewport_size["height"] / 2   # side by side, no scrolling
        assert all(chart["top"] > first["top"] for chart in rest)

        # a browser that never opened the run lays the page out afresh: the same two charts first
        fresh = browser.new_context().new_page()
        fresh.goto(tracker.browse_hint())
        sections_fresh, charts_fresh = layout(fresh, "ui-demo (_headline/val_reward_mean)")
        assert sections_fresh == sections
        assert [c["title"] for c in charts_fresh[:2]] == ["reward_mean", "val_reward_mean"]
    finally:
        server.stop()
