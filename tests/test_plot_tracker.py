"""The plot tracker: metrics.png with real matplotlib, its redraw schedule, resume and failure handling."""

from __future__ import annotations

import gc
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT, cli_env, read_metrics, run_cli

from nanoverl_core.builtins import plot_tracker
from nanoverl_core.builtins.plot_tracker import PlotSettings, PlotTracker, make_tracker
from nanoverl_core.config import Config
from nanoverl_core.processes import resident_mib

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class FakeClock:
    """Stands in for the module's `time`: the redraw schedule without sleeping."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(plot_tracker, "time", fake)
    return fake


def step_metrics(step: int, val: bool = False) -> dict[str, float]:
    metrics = {"reward/mean": step / 10, "actor/entropy": 2.0 - step / 20, "rollout/response_length/mean": 3.0 + step,
               "rollout/response_length/max": 5.0 + step, "timing/step": 0.1}
    if val:
        metrics.update({"val/reward/mean": step / 12, "val/a/reward/mean": step / 11, "val/b/reward/mean": step / 13})
    return metrics


def tracker(run_dir: Path, state: dict | None = None, every_s: float = 30.0) -> PlotTracker:
    config = Config()
    config.trainer.total_steps = 10
    config.tracking.settings["plot"] = PlotSettings(every_s=every_s)
    return make_tracker(config, run_dir, state)


def assert_valid_png(path: Path) -> None:
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_MAGIC
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] >= 400 and image.shape[1] >= 600, image.shape
    assert image.std() > 0.01  # something is drawn, not a blank canvas


def test_png_after_close_is_valid_and_written_atomically(tmp_path):
    t = tracker(tmp_path)
    for step in range(1, 6):
        t.log_metrics(step_metrics(step, val=step % 2 == 0), step)
    t.close(True)
    assert_valid_png(tmp_path / "metrics.png")
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.png"]  # no temp file left behind
    assert t.series("reward/mean") == ([1, 2, 3, 4, 5], [0.1, 0.2, 0.3, 0.4, 0.5])
    assert t.val_sources() == ["a", "b"]
    assert t.state_dict() == {"step": 5}
    json.dumps(t.state_dict())


def test_redraws_every_every_s_on_validation_and_on_close(tmp_path, clock):
    t = tracker(tmp_path, every_s=30)
    for step in range(1, 4):  # 10 s apart: inside the interval since the start
        clock.now += 10
        t.log_metrics(step_metrics(step), step)
        assert t.draws == (1 if step == 3 else 0), step  # step 3 ends 30 s after the start
    assert_valid_png(tmp_path / "metrics.png")
    clock.now += 1
    t.log_metrics(step_metrics(4, val=True), 4)
    assert t.draws == 2  # a validation step redraws at once (the fake clock makes drawing free)
    clock.now += 1
    t.log_metrics(step_metrics(5), 5)
    assert t.draws == 2
    t.close(False)
    assert t.draws == 3
    assert_valid_png(tmp_path / "metrics.png")


def test_validation_redraws_are_held_back_when_drawing_is_slow(tmp_path, clock):
    t = tracker(tmp_path, every_s=30)
    clock.now += 30
    t.log_metrics(step_metrics(1), 1)
    assert t.draws == 1
    t._draw_s = 2.0  # as if a draw took 2 s: validation redraws wait 10 draw-times
    clock.now += 5
    t.log_metrics(step_metrics(2, val=True), 2)
    assert t.draws == 1
    clock.now += 15
    t.log_metrics(step_metrics(3, val=True), 3)
    assert t.draws == 2


def test_every_s_zero_redraws_every_step(tmp_path, clock):
    t = tracker(tmp_path, every_s=0)
    for step in range(1, 4):
        t.log_metrics(step_metrics(step), step)
    assert t.draws == 3


def test_redraws_reuse_one_figure_so_resident_memory_stays_flat(tmp_path):
    """A figure per draw left each old one, and its canvas's ~4 MiB pixel buffer, to the cyclic
    collector, which does not count the buffer: a long run grew ~5 MiB a draw between full collections.
    With the collector off, 8 redraws hold one renderer and well under 8 x 4 MiB more."""
    from matplotlib.backends.backend_agg import RendererAgg

    t = tracker(tmp_path, every_s=0)
    t.log_metrics(step_metrics(1), 1)            # the first draw: matplotlib's imports, fonts, one buffer
    gc.collect()
    gc.disable()
    try:
        before = resident_mib()
        for step in range(2, 10):
            t.log_metrics(step_metrics(step), step)
        grown = resident_mib() - before
        renderers = sum(isinstance(o, RendererAgg) for o in gc.get_objects())
    finally:
        gc.enable()
    assert t.draws == 9
    assert grown < 12, f"{grown:.1f} MiB after 8 draws"
    assert renderers == 1
    assert_valid_png(tmp_path / "metrics.png")


def test_resume_plots_the_history_from_metrics_jsonl(tmp_path):
    rows = [{"step": s, **step_metrics(s, val=s == 4)} for s in range(1, 8)]
    lines = [json.dumps(r) for r in rows] + ['{"step": 8, "reward/me']  # cut short by a kill
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    t = tracker(tmp_path, state={"step": 5})  # the checkpoint's step: 6 and 7 are about to be replayed
    assert t.series("reward/mean")[0] == [1, 2, 3, 4, 5]
    assert t.series("val/reward/mean") == ([4], [4 / 12])
    assert t.state_dict() == {"step": 5}
    t.log_metrics({**step_metrics(6), "reward/mean": 0.99}, 6)
    t.close(True)
    assert t.series("reward/mean") == ([1, 2, 3, 4, 5, 6], [0.1, 0.2, 0.3, 0.4, 0.5, 0.99])
    assert_valid_png(tmp_path / "metrics.png")


def test_resume_without_own_state_reads_every_row_and_a_relogged_step_keeps_the_last_value(tmp_path):
    rows = [{"step": s, **step_metrics(s)} for s in (1, 2, 3, 3)]
    rows[-1]["reward/mean"] = 0.7  # a step written twice: the later row wins
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = tracker(tmp_path, state={})  # resumed, but "plot" was not among the checkpoint's trackers
    assert t.series("reward/mean") == ([1, 2, 3], [0.1, 0.2, 0.7])
    t.log_metrics({"reward/mean": 0.8}, 3)  # a replayed step replaces its row
    assert t.series("reward/mean") == ([1, 2, 3], [0.1, 0.2, 0.8])
    assert t.series("actor/entropy")[0] == [1, 2]


def test_fresh_run_ignores_an_old_metrics_jsonl_and_removes_a_stale_temp_file(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 3, "reward/mean": 0.5}) + "\n")
    (tmp_path / "metrics.png.tmp").write_bytes(b"\x89PNG half")  # a kill mid-write
    t = tracker(tmp_path, state=None)
    assert t.rows == {}
    assert not (tmp_path / "metrics.png.tmp").exists()


def test_nan_inf_and_non_numbers_are_skipped(tmp_path):
    t = tracker(tmp_path, every_s=0)
    t.log_metrics({"reward/mean": 0.5, "actor/entropy": float("nan")}, 1)
    t.log_metrics({"reward/mean": float("nan"), "actor/entropy": 1.0}, 2)
    t.log_metrics({"reward/mean": math.inf, "rollout/response_length/mean": "n/a", "val/reward/mean": None}, 3)
    t.log_metrics({"reward/mean": 0.6}, 4)
    t.close(True)
    assert t.series("reward/mean") == ([1, 4], [0.5, 0.6])
    assert t.series("actor/entropy") == ([2], [1.0])
    assert t.series("val/reward/mean") == ([], [])
    assert_valid_png(tmp_path / "metrics.png")


def test_missing_metrics_do_not_crash(tmp_path, capsys):
    t = tracker(tmp_path, every_s=0)
    t.log_metrics({"timing/step": 0.1}, 1)  # nothing the plot draws
    t.log_metrics({"reward/mean": 0.1}, 2)  # no entropy, validation or lengths
    t.log_samples("rollouts", [{"prompt": "1=", "response": "1"}], 2)
    t.close(True)
    assert_valid_png(tmp_path / "metrics.png")
    assert "warning" not in capsys.readouterr().err


def test_nothing_logged_writes_no_png(tmp_path):
    t = tracker(tmp_path)
    t.close(False)  # e.g. the trainer failed to load its data
    assert not (tmp_path / "metrics.png").exists()


def test_a_failing_draw_warns_once_and_never_raises(tmp_path, capsys):
    (tmp_path / "metrics.png").mkdir()  # os.replace onto a folder fails
    t = tracker(tmp_path, every_s=0)
    for step in range(1, 4):
        t.log_metrics(step_metrics(step), step)
    t.close(True)
    err = capsys.readouterr().err
    assert err.count("warning: plot: could not write") == 1, err
    assert not (tmp_path / "metrics.png.tmp").exists()
    assert t.draws == 0


def test_importing_the_module_does_not_import_matplotlib(tmp_path):
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "import nanoverl_core, nanoverl_core.builtins.plugin\n"
        "from nanoverl_core.builtins.plot_tracker import make_tracker\n"
        "from nanoverl_core.config import Config\n"
        "assert 'matplotlib' not in sys.modules, 'imported at module import'\n"
        f"t = make_tracker(Config(), Path({str(tmp_path)!r}), None)\n"
        "assert 'matplotlib' not in sys.modules, 'imported by the constructor'\n"
        "t.log_metrics({'reward/mean': 0.5}, 1)\n"
        "assert 'matplotlib' not in sys.modules, 'imported before a draw was due'\n"
        "t.close(True)\n"
        "assert 'matplotlib' in sys.modules and 'matplotlib.pyplot' not in sys.modules\n"
    )
    env = cli_env()
    env.pop("MPLBACKEND", None)  # the tracker must not need it
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "metrics.png").read_bytes()[:8] == PNG_MAGIC


def test_cli_run_writes_metrics_png(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("--config", str(EXAMPLES / "debug_reinforce.toml"), "trainer.total_steps=3", "trainer.val_every=2",
                   "trainer.progress=none", "tracking.trackers=[jsonl,plot]", f"trainer.output_dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning: tracker plot" not in proc.stderr and "warning: plot" not in proc.stderr, proc.stderr
    assert [row["step"] for row in read_metrics(run_dir)] == [1, 2, 3]
    assert_valid_png(run_dir / "metrics.png")
    assert not (run_dir / "metrics.png.tmp").exists()
    state = json.loads(next((run_dir / "checkpoints").glob("*/state.json")).read_text())
    assert state["trackers"]["plot"] == {"step": 3}
