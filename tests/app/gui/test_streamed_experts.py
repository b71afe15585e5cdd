"""A Mixture-of-Experts model too large for this machine's memory with its experts mapped opens with them
streamed from disk: the status line says what to expect, then the share of the experts found in memory; the
memory for them is a setting, remembered and passed to the next load; the picker says so rather than refusing."""

import pytest

from app.gui.preferences import Preferences
from app.gui.settings_dialog import SettingsDialog
from app.gui.status_line import describe
from app.gui.worker import EngineStatus
from engine.models import footprint
from engine.models.expert_store import USAGE_SUFFIX, load_usage
from tests.app.gui.test_documents import GREEDY, send


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    from tests.moe_models import write_moe_model

    path = tmp_path_factory.mktemp("gui-experts") / "moe.gguf"
    write_moe_model(path, "q8_0")
    return path


@pytest.fixture
def gui_model(moe_model):
    return moe_model


@pytest.fixture
def small_memory(moe_model, monkeypatch):
    """This machine's memory holds the model's other weights and half of its experts, not all of them."""
    fp = footprint.file_footprint(moe_model)
    others = fp.weight_bytes - fp.expert_bytes
    monkeypatch.setattr(footprint, "machine_memory",
                        lambda: footprint.RUNTIME_BYTES + others + fp.expert_bytes // 2)
    return fp


def test_a_model_larger_than_memory_streams_its_experts_and_the_status_line_says_how_it_goes(
        qtbot, open_window, small_memory, moe_model):
    window = open_window()
    store = window.client.worker.model.expert_store
    assert store is not None and store.options.cache_bytes <= small_memory.expert_bytes
    qtbot.waitUntil(lambda: "streams experts from disk: expect about" in window.status_line.text())
    assert "GB of experts held in memory" in window.status_line.toolTip()
    window.apply_settings(GREEDY)
    send(qtbot, window, "Hello")
    qtbot.waitUntil(lambda: "found in memory" in window.status_line.text())
    assert store.stats.hits + store.stats.misses > 0
    window.close()  # the model let go: what it routed is kept beside it, for the next load's pins
    assert load_usage(str(moe_model) + USAGE_SUFFIX)


def test_the_memory_for_streamed_experts_is_a_remembered_setting_given_to_the_next_load(
        qtbot, open_window, small_memory, fucina_home):
    window = open_window()
    dialog = window.edit_settings()
    assert dialog.expert_cache.text() == "automatic" and window.preferences.expert_cache is None
    dialog.expert_cache.setValue(1)
    dialog.accept()
    assert window.preferences.expert_cache == 1 << 20
    window.load_model(window.model_path)  # the next load takes the new budget

    def budget_taken():  # the worker holds no model while the next one loads
        model = window.client.worker.model
        return model is not None and model.expert_store.options.cache_bytes == 1 << 20

    qtbot.waitUntil(budget_taken, timeout=60_000)
    window.close()
    from app.gui.main_window import PREFERENCES_FILE
    again = SettingsDialog({"system_prompt": None, "sampler": {}}, Preferences(fucina_home / PREFERENCES_FILE))
    qtbot.addWidget(again)
    assert again.expert_cache.value() == 1 and again.expert_cache_bytes() == 1 << 20


def test_the_picker_offers_a_model_whose_experts_stream_rather_than_refusing_it(qtbot, moe_model, small_memory,
                                                                                  monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    from app.gui.model_picker import ModelPicker

    warnings, chosen = [], []
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text: warnings.append(text))
    picker = ModelPicker([str(moe_model)])
    qtbot.addWidget(picker)
    qtbot.waitUntil(lambda: picker.recent.item(0).text().endswith("; streams its experts from disk here"))
    picker.model_chosen.connect(chosen.append)
    picker.choose(str(moe_model))
    assert chosen == [str(moe_model)] and not warnings
    assert footprint.memory_verdict(small_memory).endswith("it does not fit, and its experts stream from disk")


def test_the_status_line_shows_the_outlook_until_experts_were_routed_then_their_hit_rate():
    waiting = EngineStatus(context_size=4096, experts_note="streams experts from disk: expect about 1.6 tok/s")
    assert describe(waiting).endswith("cold start  ·  streams experts from disk: expect about 1.6 tok/s")
    routed = EngineStatus(context_size=4096, experts_note="streams experts from disk", experts_hit_rate=0.354,
                          backend="cpu")
    assert describe(routed).endswith("experts streamed from disk: 35% found in memory  ·  on cpu")
