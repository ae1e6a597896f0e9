"""Python's cyclic garbage collector, run on the GUI thread only.

CPython runs a collection in whichever thread happens to allocate past the threshold. In
GradScope that is usually the run thread, which allocates heavily (the user's model, origin
localisation). Any Qt object caught in a reference cycle (pyqtgraph items, closed dialogs, a
replaced plot) is then destroyed there, on the wrong thread, which Qt does not allow; most
likely its C++ destructor waits for something the GUI thread holds while that thread waits
for the GIL, which the collecting thread holds: the app freezes. This was seen for real: CI
hung in a GUI test, and forcing collections in the run thread reproduces it within a few runs
(the run thread in ``gc.collect`` and the GUI thread painting a pyqtgraph item, both stuck).

The fix is the one pyqtgraph documents (``pyqtgraph.util.garbage_collector``): turn automatic
collection off and collect from a timer on the GUI thread, by the same per-generation
thresholds CPython uses. Collections of the oldest generation are spaced out
(``FULL_COLLECTION_SECONDS``) so a fast run does not stall the event loop with them.
Reference counting still frees everything that is not in a cycle at once, on any thread.

A model load creates many long-lived objects (the model, the modules torch imports on first
use, such as its compiler stack for the first optimizer); collections during the run would
traverse them again and again, and a full one takes 100-250 ms here.
:meth:`GuiThreadCollector.settle` does that work once, when a pause is expected (start-up, a
model has loaded): one full collection, then ``gc.freeze()`` moves every survivor out of later
collections' way. It unfreezes first, so a model that was alive at the last settle and is
garbage now is freed.
"""

from __future__ import annotations

import gc
import threading
import time

from PySide6.QtCore import QCoreApplication, QObject, QTimer

CHECK_INTERVAL_MS = 250
FULL_COLLECTION_SECONDS = 10.0


class GuiThreadCollector(QObject):
    """Owns the timer that collects garbage on the GUI thread; see the module docstring."""

    def __init__(self, parent: QObject) -> None:
        super().__init__(parent)
        self.thresholds = gc.get_threshold()
        self.collections = [0, 0, 0]  # per generation, for tests and diagnostics
        self._last_full = time.monotonic()
        self.timer = QTimer(self)
        self.timer.setInterval(CHECK_INTERVAL_MS)
        self.timer.timeout.connect(self._on_timer_timeout)
        self._was_enabled = gc.isenabled()
        self.start()

    def start(self) -> None:
        """Take automatic collection over (again, after :meth:`stop`)."""
        if not self.timer.isActive():
            self._was_enabled = gc.isenabled()
        gc.disable()
        self.timer.start()

    def stop(self) -> None:
        """Hand collection back to Python as it was before: the timer stops, what settle set
        aside is collected normally again, automatic collection is on if it was (tests use
        this, so that one test's frozen heap is not every later test's)."""
        self.timer.stop()
        gc.unfreeze()
        if self._was_enabled:
            gc.enable()

    def _on_timer_timeout(self) -> None:
        if gc.isenabled():  # something turned it back on: the run thread may collect again
            gc.disable()
        self.collect_due()

    def settle(self) -> float:
        """Collect everything, then exempt the survivors from later collections (see the
        module docstring); returns the seconds it took."""
        started = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self._last_full = time.monotonic()
        return time.perf_counter() - started

    def collect_due(self) -> int | None:
        """Collect the oldest generation whose threshold is passed; returns the generation
        collected, or None when nothing was due."""
        count0, count1, count2 = gc.get_count()
        threshold0, threshold1, threshold2 = self.thresholds
        if threshold0 <= 0 or count0 <= threshold0:
            return None
        generation = 0
        if count1 > threshold1:
            generation = 1
            now = time.monotonic()
            if count2 > threshold2 and now - self._last_full >= FULL_COLLECTION_SECONDS:
                generation = 2
                self._last_full = now
        gc.collect(generation)
        self.collections[generation] += 1
        return generation


_collector: GuiThreadCollector | None = None


def collect_on_gui_thread() -> GuiThreadCollector:
    """Start collecting garbage on the GUI thread only (once per application; later calls
    return the same collector). Call it from the GUI thread with a QApplication running."""
    global _collector
    app = QCoreApplication.instance()
    if app is None:
        raise RuntimeError("collect_on_gui_thread needs a QApplication")
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("collect_on_gui_thread must be called from the GUI thread")
    try:
        current = _collector.parent() if _collector is not None else None
    except RuntimeError:  # the collector went with an earlier QApplication
        current = None
    if current is not app:
        _collector = GuiThreadCollector(app)
    else:
        _collector.start()
    return _collector


def stop_collecting() -> None:
    """Stop the application's collector, if any (see :meth:`GuiThreadCollector.stop`)."""
    if _collector is None:
        return
    try:
        _collector.stop()
    except RuntimeError:  # gone with its QApplication
        pass
