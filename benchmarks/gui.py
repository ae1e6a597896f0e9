"""Does the app keep up? Three measurements, offscreen (QT_QPA_PLATFORM=offscreen):

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/gui.py [--skip-launch]
    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/gui.py --big-history-only

1. Big history: 500 watched layers x 20,000 steps. Time of one full refresh of all plots
   (the window's ``_refresh``: new data into every plot) after 10 new steps arrived (as
   during a run), the same with no new step, and the first refresh when the history is
   opened (every plot drawn from nothing); painting the window after a refresh, the same
   zoomed into 1/10 of the steps, a zoom or pan with its paint, and the history's bytes per
   layer, step and statistic kept. Targets: refresh under 30 ms; history under 32 bytes.
2. Throughput: a tiny model stepping as fast as it can, headless (StepRunner alone, with the
   settings the app runs it with) and with the app attached (same steps through the
   window's run thread, the GUI thread in Qt's event loop), in interleaved rounds (the
   median of the rounds' ratios); the worst gap of a 10 ms timer in the GUI thread while
   the app runs (in segments of their own, whose steps/s are reported too), and how often
   the plots were redrawn. Targets: >= 90% of the headless steps/s; gap < 100 ms.
3. Launch: from process start to a usable window (shown, its event loop running; the sample
   model then loads on the run thread) and to the model loaded, next to
   ``python -c "import torch, PySide6.QtWidgets, pyqtgraph"``. Target: at most +30% for the
   usable window. (The model's first optimizer imports torch._dynamo, about 1.5 s here: a
   cost of torch that any training script pays too, and the window stays responsive.)

Writes ``benchmarks/results/gui.json``.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("GRADSCOPE_RUNS_DIR", tempfile.mkdtemp(prefix="gradscope-bench-runs-"))
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LAYERS, STEPS = 500, 20_000
NEW_STEPS_PER_REFRESH = 10
ZOOM_ROUNDS = 5
TINY = '''
import torch
from torch import nn
CONFIG = {"steps": STEPS, "batch_size": 2, "device": "cpu", "lr": 1e-3}
def build_model():
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
def make_batch(batch_size, device):
    return torch.randn(batch_size, 4), torch.randn(batch_size, 1)
'''


def big_history():
    """The module tree, the history of STEPS steps, and a function that appends more steps
    (the same kind) to it."""
    import numpy as np

    from gradscope.core.history import RunHistory
    from gradscope.core.module_tree import ModuleTree
    from gradscope.core.watch import StepStats, classify

    rows = [("", "Sequential", 0, LAYERS * 20)]
    rows += [(str(i), "Linear", 20, 20) for i in range(LAYERS)]
    tree = ModuleTree.from_rows(rows)
    names = [str(i) for i in range(LAYERS)]
    history = RunHistory(capacity=STEPS)
    rng = np.random.default_rng(0)
    base = 10.0 ** rng.uniform(-9, 4, LAYERS)
    zeros = np.zeros(LAYERS, dtype=np.int64)

    def append(count: int) -> None:
        for _ in range(count):
            step = history.count
            norms = base * np.exp(rng.normal(0, 0.2, LAYERS))
            if step == STEPS // 2:
                norms[7] = np.nan
            stats = StepStats(
                step=step, loss=float(1 + np.sin(step / 500)),
                total_grad_norm=float(norms.sum()), grad_norm=norms, max_abs=norms / 3,
                weight_norm=np.ones(LAYERS), nan_count=zeros, inf_count=zeros,
                status=classify(norms, zeros, 1000.0, 1e-7), param_grad_norm=norms,
            )
            history.append(step, stats.loss, stats, names, ["Linear"] * LAYERS, [20] * LAYERS)

    append(STEPS)
    return tree, history, append


def measure_big_history(window, app) -> dict:
    from gradscope.core.history import STATISTICS
    from gradscope.core.settings import RunSettings

    started = time.perf_counter()
    tree, history, append = big_history()
    build_s = time.perf_counter() - started
    per_value = history.nbytes() / (LAYERS * history.count * len(STATISTICS))
    # Opening: every plot gets the whole history at once (nothing drawn before).
    started = time.perf_counter()
    window.show_recorded_run(tree, history, "500 layers x 20,000 steps", RunSettings())
    open_ms = (time.perf_counter() - started) * 1e3
    app.processEvents()
    window.grab()

    def timed(action, before=None, repeat=7) -> float:
        samples = []
        for _ in range(repeat):
            if before is not None:
                before()  # not timed
            started = time.perf_counter()
            action()
            samples.append(time.perf_counter() - started)
        return statistics.median(samples) * 1e3

    # A refresh while the run goes on: new steps since the last one (a run at about 300
    # steps/s and the 30 Hz refresh timer), every plot takes them.
    refresh_ms = timed(window._refresh, before=lambda: append(NEW_STEPS_PER_REFRESH))
    unchanged_ms = timed(window._refresh)
    paint_ms = timed(lambda: window.grab(), before=lambda: (append(NEW_STEPS_PER_REFRESH),
                                                             window._refresh()))
    plot = window.plots.gradient_norm.widget.getPlotItem()
    steps = history.count
    plot.setXRange(steps * 0.45, steps * 0.55, padding=0)
    app.processEvents()
    zoom_paint_ms = timed(lambda: window.grab())
    # Zooming and panning: the new range and the paint that shows it, in ZOOM_ROUNDS rounds
    # of 8 (the median of each round; the figure is the median of the rounds).
    ranges = itertools.cycle([(0.2, 0.8), (0.45, 0.55), (0.5, 0.6), (0.0, 1.0)])

    def zoom() -> None:
        low, high = next(ranges)
        plot.setXRange(steps * low, steps * high, padding=0)
        window.grab()

    zoom_rounds = [round(timed(zoom, repeat=8), 1) for _ in range(ZOOM_ROUNDS)]
    zoom_ms = statistics.median(zoom_rounds)
    return {
        "layers": LAYERS, "steps": STEPS, "history_build_s": round(build_s, 2),
        "open_ms": round(open_ms, 1), "refresh_ms": round(refresh_ms, 1),
        "new_steps_per_refresh": NEW_STEPS_PER_REFRESH,
        "refresh_unchanged_ms": round(unchanged_ms, 1), "paint_ms": round(paint_ms, 1),
        "zoomed_paint_ms": round(zoom_paint_ms, 1), "zoom_or_pan_ms": round(zoom_ms, 1),
        "zoom_or_pan_ms_rounds": zoom_rounds,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "history_bytes_per_layer_step_statistic": round(per_value, 2),
    }


class Headless:
    """The same run headless: a StepRunner stepping in this thread, with Python's automatic
    garbage collection on, as in ``gradscope run``. (The window turned automatic collection
    off: it collects on the GUI thread's event loop, which does not run while this steps.)"""

    def __init__(self, script: str, defaults: dict | None = None) -> None:
        from gradscope.core.runner import StepRunner
        from gradscope.core.sources import load_with_settings

        loaded, settings = load_with_settings(script, {}, defaults=defaults or {})
        self.runner = StepRunner(loaded, settings)
        self.rate(0.5)  # warm-up

    def rate(self, seconds: float) -> float:
        collecting = gc.isenabled()
        gc.enable()
        try:
            done, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                self.runner.step()
                done += 1
            return done / (time.perf_counter() - started)
        finally:
            if not collecting:
                gc.disable()

    def close(self) -> None:
        self.runner.close()


def measure_throughput(window, app, script: str, rounds: int = 8,
                       segment_s: float = 1.5) -> dict:
    """The app's steps/s against the same run headless, in interleaved rounds (as in
    overhead.py). Each round measures, in a random order and for ``segment_s`` each: the
    run headless; the app; and the app with the 10 ms probe timer that finds the event
    loop's worst gap. A round's ratios are each app figure / headless. Machine drift (other
    load on a shared machine moved single 4-second measurements by up to 15% here) then
    hits every side alike. The probe is measured apart because it costs the run thread by
    itself: each of its 100 wakes a second takes the GIL. While the headless runner steps,
    the app's run is paused (its thread idle, the window's event loop not running); an app
    segment starts a moment after the run resumes, and counts the engine's steps."""
    import random

    from PySide6.QtCore import QEventLoop, QTimer

    from gradscope.gui.main_window import APP_DEFAULTS

    def run_event_loop(seconds: float) -> None:
        # The app's own way of waiting: Qt's event loop, which sleeps (and lets the run
        # thread have the GIL) when there is nothing to do. A loop of processEvents() calls
        # would spin in Python and take the GIL from the run thread all the time.
        waiting = QEventLoop()
        QTimer.singleShot(int(seconds * 1000), waiting.quit)
        waiting.exec()

    def wait_for(condition, limit: float = 10.0) -> None:
        deadline = time.perf_counter() + limit
        while not condition() and time.perf_counter() < deadline:
            run_event_loop(0.01)

    # With the settings the app runs it with (its defaults turn the update ratio and the
    # rewind snapshots on); the engine's own defaults for reference.
    headless = Headless(script, defaults=APP_DEFAULTS)
    engine_defaults = Headless(script)
    engine_defaults_rate = engine_defaults.rate(2.0)
    engine_defaults.close()
    loop = QEventLoop()
    window.model_loaded.connect(lambda _p: loop.quit())
    window.open_model(script, {"steps": 10**6})
    loop.exec()
    gaps: list[float] = []
    last = [time.perf_counter()]

    def tick() -> None:
        now = time.perf_counter()
        gaps.append(now - last[0])
        last[0] = now

    probe = QTimer()
    probe.setInterval(10)
    probe.timeout.connect(tick)
    refreshes = [0]
    measuring = [False]
    refresh = window._refresh

    def counted_refresh() -> None:
        refreshes[0] += measuring[0]
        refresh()

    window._refresh = counted_refresh
    window.run()
    run_event_loop(2.0)  # warm-up

    def app_rate(probed: bool) -> float:
        if window.state != "running":
            window.run()
            run_event_loop(0.3)  # the run going again, the redraw timer settled
        if probed:
            last[0] = time.perf_counter()
            probe.start()
        # Steps counted at the engine (the run thread's own counter), not in the window's
        # history, which grows a batch (0.1 s of steps) at a time.
        runner = window.run_thread.worker.runner
        first, started = runner.step_index, time.perf_counter()
        measuring[0] = True
        run_event_loop(segment_s)
        done, elapsed = runner.step_index - first, time.perf_counter() - started
        measuring[0] = False
        probe.stop()
        app_seconds[0] += elapsed
        return done / elapsed

    rng = random.Random(0)
    rates: dict[str, list[float]] = {"headless": [], "app": [], "app_probed": []}
    app_seconds = [0.0]
    for _ in range(rounds):
        for side in rng.sample(list(rates), len(rates)):
            if side == "headless":
                if window.state == "running":
                    window.pause()
                    wait_for(lambda: window.state != "running")
                rates[side].append(headless.rate(segment_s))
            else:
                rates[side].append(app_rate(probed=side == "app_probed"))
    del window._refresh
    window.stop()
    wait_for(lambda: window.state != "running")
    headless.close()

    def ratios(side: str) -> list[float]:
        return sorted(a / h for a, h in zip(rates[side], rates["headless"], strict=True))

    plain, probed = ratios("app"), ratios("app_probed")
    return {
        "rounds": rounds,
        "seconds_per_side_per_round": segment_s,
        "headless_steps_per_s": round(statistics.median(rates["headless"]), 1),
        "headless_engine_defaults_steps_per_s": round(engine_defaults_rate, 1),
        "app_steps_per_s": round(statistics.median(rates["app"]), 1),
        "app_fraction_of_headless": round(statistics.median(plain), 3),
        "app_fraction_min_max": [round(plain[0], 3), round(plain[-1], 3)],
        "app_fraction_with_probe_timer": round(statistics.median(probed), 3),
        "app_fraction_with_probe_timer_min_max": [round(probed[0], 3), round(probed[-1], 3)],
        "worst_event_loop_gap_ms": round(max(gaps) * 1e3, 1),
        "plot_redraws_per_s": round(refreshes[0] / app_seconds[0], 1),
    }


# Both children print wall-clock times (time.time()); the parent subtracts the moment it
# started them, so interpreter start-up counts and interpreter shut-down does not.
FLOOR_CHILD = "import torch, PySide6.QtWidgets, pyqtgraph, time; print(time.time())"
LAUNCH_CHILD = """
import time, sys
from gradscope.gui.app import make_application
from gradscope.gui.main_window import MainWindow
from PySide6.QtCore import QSettings, QTimer
app = make_application()
window = MainWindow(QSettings({ini!r}, QSettings.Format.IniFormat), persist=False)
window.resize(1280, 800)
window.show()
app.processEvents()
usable = time.time()
window.model_loaded.connect(lambda _p: QTimer.singleShot(0, app.quit))
window.open_model({script!r})
app.exec()
print(usable, time.time())
window.close()
"""


def measure_launch(script: str) -> dict:
    ini = tempfile.mktemp(suffix=".ini")
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def since_start(code: str) -> list[float]:
        started = time.time()
        done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                              text=True, env=env)
        return [float(value) - started for value in done.stdout.split()]

    floors, usable, loaded = [], [], []
    for _ in range(3):
        floors.append(since_start(FLOOR_CHILD)[0])
        shown, ready = since_start(LAUNCH_CHILD.format(ini=ini, script=script))
        usable.append(shown)
        loaded.append(ready)
    floor = statistics.median(floors)
    return {
        "import_floor_s": round(floor, 2),
        "launch_to_usable_window_s": round(statistics.median(usable), 2),
        "launch_to_model_loaded_s": round(statistics.median(loaded), 2),
        "usable_over_floor": round(statistics.median(usable) / floor, 3),
        "loaded_over_floor": round(statistics.median(loaded) / floor, 3),
    }


def main() -> None:
    import torch
    from PySide6.QtCore import QSettings

    from gradscope.gui.app import make_application
    from gradscope.gui.main_window import MainWindow

    torch.set_num_threads(os.cpu_count() or 1)
    app = make_application()
    folder = Path(tempfile.mkdtemp(prefix="gradscope-bench-"))
    script = folder / "tiny.py"
    script.write_text(TINY.replace("STEPS", "10**6"))
    window = MainWindow(QSettings(str(folder / "p.ini"), QSettings.Format.IniFormat),
                        persist=False)
    window.resize(1440, 900)
    window.show()
    app.processEvents()
    results = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                          f"torch {torch.__version__}, offscreen Qt"}
    results["big_history"] = measure_big_history(window, app)
    print("big history:", results["big_history"], flush=True)
    if "--big-history-only" in sys.argv[1:]:
        # Only the first measurement (refresh, paint, zoom of the big history), to
        # benchmarks/results/gui-big-history.json.
        window.close()
        window.run_thread.shutdown()
        out = ROOT / "benchmarks" / "results" / "gui-big-history.json"
        out.write_text(json.dumps(results, indent=1) + "\n")
        return
    results["throughput"] = measure_throughput(window, app, str(script))
    print("throughput:", results["throughput"], flush=True)
    window.close()
    window.run_thread.shutdown()
    sample = str(ROOT / "sample_models" / "seed_explosion.py")
    # --skip-launch: only the first two measurements (while working on them); the results
    # then go to gui-partial.json, not over the full ones.
    skip_launch = "--skip-launch" in sys.argv[1:]
    results["launch"] = {} if skip_launch else measure_launch(sample)
    print("launch:", results["launch"] or "skipped", flush=True)
    big, rate, launch = results["big_history"], results["throughput"], results["launch"]
    print(f"\n{'measure':44} {'value':>10}  target")
    for label, value, target in (
        ("full refresh, 500 layers x 20k steps (ms)", big["refresh_ms"], "< 30"),
        ("  the same, no new step (ms)", big["refresh_unchanged_ms"], ""),
        ("  opening it: first refresh, from nothing (ms)", big["open_ms"], ""),
        ("paint after refresh (ms)", big["paint_ms"], ""),
        ("paint zoomed to 1/10 of the steps (ms)", big["zoomed_paint_ms"], ""),
        ("zoom or pan, with its paint (ms)", big["zoom_or_pan_ms"], ""),
        ("history bytes per layer/step/statistic", big["history_bytes_per_layer_step_statistic"],
         "< 32"),
        ("app steps/s as a fraction of headless", rate["app_fraction_of_headless"], ">= 0.9"),
        ("  the same, 10 ms probe timer running", rate["app_fraction_with_probe_timer"], ""),
        ("worst event-loop gap (ms)", rate["worst_event_loop_gap_ms"], "< 100"),
        ("plot redraws per second during that run", rate["plot_redraws_per_s"], ""),
        ("launch to a usable window / import floor", launch.get("usable_over_floor", "-"),
         "<= 1.3"),
        ("launch to the model loaded / import floor", launch.get("loaded_over_floor", "-"), ""),
    ):
        print(f"{label:44} {value:>10}  {target}")
    out = ROOT / "benchmarks" / "results" / ("gui-partial.json" if skip_launch else "gui.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
