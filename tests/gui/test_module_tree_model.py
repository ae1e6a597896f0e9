"""The Qt item model over the engine's module tree."""

from __future__ import annotations

from PySide6.QtCore import Qt
from torch import nn

from gradscope.core.module_tree import build_module_tree
from gradscope.core.watch import STATUS_EXPLODING, STATUS_NONFINITE, STATUS_OK
from gradscope.gui.module_tree_model import (
    GRAD_NORM,
    NAME,
    STATUS,
    ModuleFilterModel,
    ModuleTreeModel,
)
from gradscope.gui.status_style import ORIGIN_TINT, STATUS_TINTS

CHECK = Qt.ItemDataRole.CheckStateRole


def nested_model() -> nn.Module:
    return nn.Sequential(
        nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8)),
        nn.Sequential(nn.Linear(8, 8), nn.Tanh()),
        nn.Linear(8, 1),
    )


def make_model(watched: list[str] | None = None) -> ModuleTreeModel:
    model = ModuleTreeModel()
    tree = build_module_tree(nested_model())
    layers = ["0.0", "0.2", "1.0", "2"] if watched is None else watched
    model.set_tree(tree, layers)
    return model


def test_tree_model_passes_qtmodeltester(qtmodeltester) -> None:
    model = make_model()
    model.set_step_values({"0.0": 1.0, "0.2": float("nan")}, {"0.0": 0, "0.2": STATUS_NONFINITE})
    model.set_origin("0.2", "step 0: first NAN", "nan")
    qtmodeltester.check(model, force_py=True)


def test_filter_proxy_passes_qtmodeltester(qtmodeltester) -> None:
    proxy = ModuleFilterModel()
    proxy.setSourceModel(make_model())
    proxy.set_filter_text("linear")
    qtmodeltester.check(proxy, force_py=True)


def test_rows_mirror_the_engine_tree() -> None:
    model = make_model()
    root = model.index(0, 0)
    assert model.rowCount() == 1
    assert model.rowCount(root) == 3
    first = model.index(0, 0, root)
    assert model.data(first) == "0"
    assert model.node(model.index(2, 0, first)).name == "0.2"
    assert model.parent(model.index(2, 0, first)) == first


def test_ticking_a_parent_ticks_its_subtree_and_parents_are_tristate() -> None:
    model = make_model(watched=[])
    edits: list[list[str]] = []
    model.watched_layers_edited.connect(edits.append)
    block = model.index_of("0")
    root = model.index_of("")
    assert model.data(root, CHECK) == Qt.CheckState.Unchecked
    assert model.setData(block, Qt.CheckState.Checked.value, CHECK)
    assert edits[-1] == ["0.0", "0.2"]
    assert model.data(block, CHECK) == Qt.CheckState.Checked
    assert model.data(root, CHECK) == Qt.CheckState.PartiallyChecked
    assert model.setData(model.index_of("0.2"), Qt.CheckState.Unchecked, CHECK)
    assert edits[-1] == ["0.0"]
    assert model.data(block, CHECK) == Qt.CheckState.PartiallyChecked
    assert model.setData(root, Qt.CheckState.Checked, CHECK)
    assert edits[-1] == ["0.0", "0.2", "1.0", "2"]
    # Modules without parameters have no checkbox.
    assert model.data(model.index_of("0.1"), CHECK) is None
    assert not model.flags(model.index_of("0.1")) & Qt.ItemFlag.ItemIsUserCheckable


def test_engine_watch_sets_the_boxes_without_announcing_an_edit() -> None:
    model = make_model()
    edits: list[list[str]] = []
    model.watched_layers_edited.connect(edits.append)
    model.set_watched(["1"])  # a container stands for its parameterised modules
    assert model.watched_layers() == ["1.0"]
    assert model.data(model.index_of("1.0"), CHECK) == Qt.CheckState.Checked
    assert model.data(model.index_of("0.0"), CHECK) == Qt.CheckState.Unchecked
    assert edits == []


def test_status_colours_and_flag_inside_collapsed_parent() -> None:
    model = make_model()
    model.set_step_values(
        {"0.0": 1.5, "0.2": 2e5, "1.0": float("inf")},
        {"0.0": STATUS_OK, "0.2": STATUS_EXPLODING, "1.0": STATUS_NONFINITE},
    )
    exploding = model.index_of("0.2")
    assert model.data(exploding, Qt.ItemDataRole.BackgroundRole).color().name() == \
        STATUS_TINTS[STATUS_EXPLODING]
    assert model.data(model.index_of("0.2", STATUS)) == "exploding"
    assert model.data(model.index_of("1.0", GRAD_NORM)) == "Inf"
    assert model.data(model.index_of("1.0", STATUS)) == "NaN/Inf"
    # Parents say something inside is flagged (the worst of their subtree).
    assert model.data(model.index_of("1", STATUS)) == "NaN/Inf"
    assert model.data(model.index_of("0", STATUS)) == "exploding"
    assert model.data(model.index_of("1", NAME), Qt.ItemDataRole.DecorationRole) is not None
    assert model.data(model.index_of("0.0", NAME), Qt.ItemDataRole.BackgroundRole) is None


def test_origin_row_is_marked_distinctly() -> None:
    model = make_model()
    model.set_step_values({"0.2": float("nan")}, {"0.2": STATUS_NONFINITE})
    model.set_origin("0.1", "step 3: first NAN in forward", "nan")
    origin = model.index_of("0.1")
    assert model.data(origin, Qt.ItemDataRole.BackgroundRole).color().name() == ORIGIN_TINT
    assert model.data(model.index_of("0.1", STATUS)) == "NaN origin"
    assert "first non-finite" in model.data(origin, Qt.ItemDataRole.ToolTipRole)
    nonfinite = model.data(model.index_of("0.2"), Qt.ItemDataRole.BackgroundRole)
    assert nonfinite.color().name() != ORIGIN_TINT


def test_filter_matches_name_or_type_and_keeps_ancestors() -> None:
    source = make_model()
    proxy = ModuleFilterModel()
    proxy.setSourceModel(source)
    proxy.set_filter_text("tanh")
    root = proxy.index(0, 0)
    assert proxy.rowCount(root) == 1  # only the block holding the Tanh
    block = proxy.index(0, 0, root)
    assert proxy.data(block) == "1"
    assert proxy.rowCount(block) == 1
    proxy.set_filter_text("0.2")
    block = proxy.index(0, 0, proxy.index(0, 0))
    assert proxy.data(proxy.index(0, 0, block)) == "2"


def test_statuses_the_engine_adds_later_are_shown_by_name(qtbot) -> None:
    # New codes come after "nonfinite" (e.g. "frozen", "no gradient"): the tree names them
    # and a NaN/Inf inside a module still outranks them.
    from torch import nn

    from gradscope.core.module_tree import build_module_tree
    from gradscope.core.watch import STATUS_NONFINITE
    from gradscope.gui.module_tree_model import STATUS, ModuleTreeModel
    from gradscope.gui.status_style import status_label

    model = ModuleTreeModel()
    model.set_tree(build_module_tree(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))), ["0", "1"])
    model.set_step_values({"0": 0.0, "1": float("nan")}, {"0": 4, "1": STATUS_NONFINITE})
    assert model.data(model.index_of("0", STATUS)) == status_label(4) != ""
    assert model.data(model.index_of("", STATUS)) == "NaN/Inf"  # the worst inside the root
    assert status_label(99) == "status 99"


def test_answers_kept_between_repaints_follow_every_change(qtbot) -> None:
    # The model keeps what it answered (a repaint asks each cell for seven roles, issue 17):
    # every way the model changes must reach the next answer.
    model = make_model()
    root = model.index(0, 0)
    layer = model.index_of("0.2")
    status = model.index_of("0.2", STATUS)
    norm = model.index_of("0.2", GRAD_NORM)
    background = Qt.ItemDataRole.BackgroundRole
    before = [model.data(i, role) for i in (layer, status, norm, root)
              for role in (Qt.ItemDataRole.DisplayRole, background, CHECK)]
    assert model.data(norm) == "" and model.data(layer, CHECK) == Qt.CheckState.Checked
    model.set_step_values({"0.2": 2000.0}, {"0.2": STATUS_EXPLODING})
    assert model.data(norm) == "2000"
    assert model.data(status) == "exploding"
    assert model.data(layer, background).color().name() == STATUS_TINTS[STATUS_EXPLODING]
    model.set_origin("0.2", "step 3: first NAN", "nan")
    assert model.data(status) == "NaN origin"
    assert model.data(layer, background).color().name() == ORIGIN_TINT
    model.set_watched(["0.0"])
    assert model.data(layer, CHECK) == Qt.CheckState.Unchecked
    assert model.data(root, CHECK) == Qt.CheckState.PartiallyChecked
    model.setData(layer, Qt.CheckState.Checked, CHECK)
    assert model.data(layer, CHECK) == Qt.CheckState.Checked
    model.set_tree(build_module_tree(nested_model()), ["0.0", "0.2", "1.0", "2"])
    after = [model.data(i, role) for i in (layer, status, norm, root)
             for role in (Qt.ItemDataRole.DisplayRole, background, CHECK)]
    assert after == before
