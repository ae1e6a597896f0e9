"""File > Open model by name (#18): transformers' model types (hf:) and timm's models
(timm:) beside torchvision's, listed in a thread when asked (the dialog opens at once, no
model is built), and an hf: model's architecture as built shown in the model notes."""

from __future__ import annotations

import json

from gradscope.gui.dialogs import ModelDialog, ZooNameLister
from tests.gui.gui_helpers import open_and_wait


def _visible(dialog: ModelDialog) -> list[str]:
    return [
        dialog.list.item(i).text()
        for i in range(dialog.list.count())
        if not dialog.list.item(i).isHidden()
    ]


def test_hf_names_are_listed_lazily_and_found_by_typing(qtbot) -> None:
    ZooNameLister.cache.clear()
    dialog = ModelDialog(None, ["alexnet", "resnet18"])
    qtbot.addWidget(dialog)
    # torchvision at once; nothing of transformers' is listed until asked.
    assert _visible(dialog) == ["alexnet", "resnet18"]
    assert not dialog._listers
    dialog.search.setText("hf:gpt")  # typing the prefix switches the list
    assert dialog.prefix() == "hf:"
    assert "listing hf models" in dialog.status.text()
    qtbot.waitUntil(lambda: dialog.list.count() > 0, timeout=90_000)
    dialog.wait_for_listers()
    assert "hf:gpt2" in _visible(dialog)
    assert all(name.startswith("hf:") and "gpt" in name for name in _visible(dialog))
    assert dialog.status.text() == ""
    dialog.search.setText("hf:gpt2")
    assert dialog.selected_name() == "hf:gpt2"
    # A name not listed, typed in full (a local folder), is what opens.
    dialog.search.setText("hf:./my_model")
    assert dialog.selected_name() == "hf:./my_model"
    # Back to torchvision: its own list again.
    dialog.library.setCurrentIndex(0)
    dialog.search.setText("res")
    assert _visible(dialog) == ["resnet18"]


def test_a_built_hf_models_architecture_is_in_the_model_notes(qtbot, window, tmp_path) -> None:
    folder = tmp_path / "tiny_gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gpt2",
                "n_layer": 1,
                "n_embd": 16,
                "n_head": 2,
                "n_positions": 32,
                "vocab_size": 40,
            }
        )
    )
    open_and_wait(qtbot, window, f"hf:{folder}", steps=1, batch_size=2)
    notes = window.settings_panel.model_notes
    assert notes.isVisibleTo(window.settings_panel)
    text = notes.text()
    assert "Built: causal LM" in text, text
    assert "image size" not in text  # the CPU note of a token model names the batch only
    assert "model type gpt2" in text and "num hidden layers 1" in text and "seq len 32" in text


def test_typing_a_name_and_enter_opens_that_model(qtbot) -> None:
    """Issue 27: the focus was not in the search box, so typing resnet18 and Enter opened
    alexnet; an exact name wins over a longer one listed first; nothing typed, nothing
    chosen."""
    from PySide6.QtCore import Qt

    dialog = ModelDialog(None, ["alexnet", "resnet18_wide", "resnet18", "vit_b_16"])
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    dialog.activateWindow()
    qtbot.waitUntil(lambda: dialog.focusWidget() is dialog.search)
    assert dialog.selected_name() is None  # nothing preselected
    qtbot.keyClicks(dialog.focusWidget(), "resnet18")
    assert dialog.search.text() == "resnet18"
    assert _visible(dialog) == ["resnet18_wide", "resnet18"]
    with qtbot.waitSignal(dialog.accepted, timeout=5_000):
        qtbot.keyClick(dialog.focusWidget(), Qt.Key.Key_Return)
    assert dialog.selected_name() == "resnet18"
    dialog.search.setText("vit")  # no exact match: the first that matches
    assert dialog.selected_name() == "vit_b_16"


def test_a_model_over_300m_parameters_asks_before_it_is_built(qtbot) -> None:
    from PySide6.QtWidgets import QDialog, QMessageBox

    dialog = ModelDialog(None, ["resnet18", "vit_h_14"])
    qtbot.addWidget(dialog)
    dialog.show()
    asked: list[str] = []

    def estimate(name: str) -> int | None:
        from gradscope.core.model_size import estimated_parameters

        asked.append(name)
        return estimated_parameters(name)

    dialog.estimate = estimate
    dialog.search.setText("resnet18")
    dialog.accept()  # 11.7M parameters: opens at once
    assert dialog.result() == QDialog.DialogCode.Accepted and dialog.size_question is None

    dialog.show()
    dialog.setResult(0)
    dialog.search.setText("vit_h_14")
    dialog.accept()
    question = dialog.size_question
    assert question is not None and question.isVisible()
    assert "vit_h_14 has about 633 million parameters" in question.text()
    assert question.defaultButton() is question.button(QMessageBox.StandardButton.No)
    assert dialog.isVisible() and dialog.result() == 0  # not built while it asks
    question.button(QMessageBox.StandardButton.No).click()
    assert dialog.isVisible() and dialog.result() == 0  # No: back to the list
    dialog.accept()
    dialog.size_question.button(QMessageBox.StandardButton.Yes).click()
    assert dialog.result() == QDialog.DialogCode.Accepted
    assert dialog.selected_name() == "vit_h_14"
    assert asked == ["resnet18", "vit_h_14", "vit_h_14"]
