"""A distributed run's recordings in the app (#14): ``gradscope open runs/run.rank1.gsrec``
or the common name shows the set: a rank selector, every rank's loss on the loss plot, and
which rank went non-finite first. The set is written by the engine itself: two gloo
processes under DDP recording with ``gradscope.watch(record=...)``, rank 1's batch with a
NaN at step 2."""

from __future__ import annotations

import numpy as np
import pytest
from models.rank_recording_worker import (
    NAN_RANK,
    NAN_STEP,
    STEPS,
    record_rank_set,
)


@pytest.fixture(scope="module")
def rank_recordings(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ranks")
    record_rank_set(folder)
    return folder


def _combo_texts(combo) -> list[str]:
    return [combo.itemText(i) for i in range(combo.count())]


def test_a_rank_file_opens_the_set_with_a_rank_selector(qtbot, window, rank_recordings):
    recordings = window.recordings
    assert not recordings.rank_view.combo.isVisibleTo(window)
    assert recordings.open_recording(rank_recordings / "run.rank0.gsrec")
    view = recordings.rank_view
    qtbot.waitUntil(lambda: view.combo.isVisibleTo(window), timeout=2000)  # toolbar layout
    assert _combo_texts(view.combo) == ["rank 0", f"rank 1 (first non-finite, step {NAN_STEP})"]
    assert view.shown_rank == 0 and view.combo.currentData() == 0
    assert window.history.count == STEPS
    # Every rank's loss on the loss plot; rank 1's is NaN at its NaN step only.
    curves = {rank: curve.getData() for rank, curve in view.curves.items()}
    assert sorted(curves) == [0, 1]
    steps0, loss0 = curves[0]
    assert steps0.tolist() == list(range(STEPS))
    assert np.allclose(loss0, window.history.losses[:STEPS])
    _, loss1 = curves[1]
    assert np.isnan(loss1[NAN_STEP]) and np.isfinite(np.delete(loss1, NAN_STEP)).all()
    assert not np.allclose(np.delete(loss0, NAN_STEP), np.delete(loss1, NAN_STEP))
    labels = [label.text for _, label in view.legend.items]
    assert labels == ["rank 0 loss (shown)", "rank 1 loss"]
    note = window.events_panel.rank_note
    assert note.isVisibleTo(window.events_panel)
    assert f"first rank to go non-finite: rank {NAN_RANK}" in note.text()
    # Choosing rank 1 shows its recording, whose own batch broke (a located origin).
    with qtbot.waitSignal(recordings.recording_opened):
        view.combo.activated.emit(1)
    assert view.shown_rank == 1 and view.combo.currentData() == 1
    origin = window.history.first_nonfinite
    assert origin is not None and origin.step == NAN_STEP and origin.phase != "unknown"
    assert "rank1" in window.windowTitle()
    assert [label.text for _, label in view.legend.items] == ["rank 0 loss", "rank 1 loss (shown)"]


def test_the_common_name_shows_rank_0_of_the_set(qtbot, window, rank_recordings):
    # As `gradscope open` does (its note says so); the selector marks the rank that broke.
    assert window.recordings.open_recording(rank_recordings / "run.gsrec")
    view = window.recordings.rank_view
    assert view.shown_rank == 0
    assert "first non-finite" in view.combo.itemText(NAN_RANK)
    # A recording of one process has no rank selector.
    single = rank_recordings.parent / "single.gsrec"
    single.write_bytes((rank_recordings / "run.rank0.gsrec").read_bytes())
    assert window.recordings.open_recording(single)
    qtbot.wait(50)
    assert not window.recordings.rank_view.combo.isVisibleTo(window)
    assert not window.events_panel.rank_note.isVisibleTo(window.events_panel)
    assert not window.recordings.rank_view.legend.isVisible()
