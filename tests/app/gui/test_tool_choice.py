"""The tool choice beside the message input: shown while tools are on, in its current state; a choice
reaches the next turn through the engine thread (Required offers the tools with that choice, None offers
none) and is remembered with the chat; a tool chosen by name and switched off since gives way to Auto. Tools
unchecked "In this chat" are not offered in that chat, while other chats keep the app's defaults."""

import pytest

from app.gui.tool_choice import ToolChoiceButton
from engine.serving.session import ChatSession
from engine.tools.builtin import READ_FILE, SEARCH_CONVERSATIONS
from engine.tools.toolbox import ToolSwitches
from tests.app.gui.test_documents import send


@pytest.fixture
def offered(monkeypatch):
    """What each turn asks its session to offer: (the tools' names, the choice); the reply is then written
    without tools (what the model does with them is test_tool_turns')."""
    asked = []

    def with_tools(self, start, toolbox, cancel=None, *, choice="auto", on_prefill=None):
        asked.append(([spec.name for spec in toolbox.specs()], choice))
        return start()

    monkeypatch.setattr(ChatSession, "with_tools", with_tools)
    return asked


def test_required_offers_the_tools_with_that_choice_none_offers_none_and_the_chat_remembers_it(
        qtbot, open_window, offered):
    window = open_window()
    window.apply_settings({"system_prompt": None, "sampler": {"temperature": 0.0, "max_tokens": 4}})
    assert window.tool_choice.isHidden()  # no tool on: nothing to choose
    window.preferences.tool_switches = ToolSwitches(frozenset({SEARCH_CONVERSATIONS}))
    window.configure_tools()
    assert window.tool_choice.isVisible() and window.tool_choice.text() == "Auto"
    window.tool_choice.options["required"].trigger()  # what choosing it in the button's menu does
    send(qtbot, window, "Hello")
    assert offered == [([SEARCH_CONVERSATIONS], "required")]
    assert window.tool_choice.text() == "Required" and window.preferences.tool_choice == "auto"  # the chat's only
    assert window.store.get_conversation(window.current_id)["tools"] == {"enabled": [SEARCH_CONVERSATIONS],
                                                                         "choice": "required"}
    window.tool_choice.options["none"].trigger()
    send(qtbot, window, "And now?")
    assert len(offered) == 1  # the turn ran without tools
    assert window.store.active_branch(window.current_id)[-1]["role"] == "assistant"
    window.close()
    again = open_window()
    assert again.tool_choice.text() == "None" and again.tool_choice.options["none"].isChecked()
    send(qtbot, again, "Once more")
    assert len(offered) == 1


def test_the_menu_offers_each_tool_on_by_name_and_one_switched_off_gives_way_to_auto(qtbot):
    button = ToolChoiceButton(READ_FILE)  # remembered from before
    qtbot.addWidget(button)
    chosen = []
    button.chosen.connect(chosen.append)
    button.show_tools([READ_FILE, SEARCH_CONVERSATIONS])
    items = [action.text() for action in button.menu().actions() if not action.isSeparator()]
    assert items == ["Auto", "Required", "None", READ_FILE, SEARCH_CONVERSATIONS, READ_FILE, SEARCH_CONVERSATIONS]
    assert all(button.in_chat[name].isChecked() for name in (READ_FILE, SEARCH_CONVERSATIONS))
    assert button.text() == READ_FILE and button.options[READ_FILE].isChecked() and chosen == []
    assert READ_FILE in button.toolTip()
    button.show_tools([SEARCH_CONVERSATIONS])
    assert chosen == ["auto"] and button.text() == "Auto" and button.options["auto"].isChecked()
    button.show_tools([])
    assert button.isHidden() and chosen == ["auto"]


def test_a_choice_set_by_the_window_is_the_one_the_button_shows(qtbot, open_window, offered):
    """set_tool_choice (what anything but the menu calls) shows the choice on the button, before and after
    the tools are listed, and the turn uses it."""
    window = open_window()
    window.apply_settings({"system_prompt": None, "sampler": {"temperature": 0.0, "max_tokens": 4}})
    window.set_tool_choice("required")  # no tool on yet: the button has nothing listed
    window.preferences.tool_switches = ToolSwitches(frozenset({SEARCH_CONVERSATIONS}))
    window.configure_tools()
    assert window.tool_choice.text() == "Required" and window.tool_choice.options["required"].isChecked()
    window.set_tool_choice("none")
    assert window.tool_choice.text() == "None" and window.preferences.tool_choice == "none"
    window.set_tool_choice(SEARCH_CONVERSATIONS)
    send(qtbot, window, "Hello")
    assert offered == [([SEARCH_CONVERSATIONS], SEARCH_CONVERSATIONS)]
    assert window.tool_choice.text() == SEARCH_CONVERSATIONS


def test_a_chat_offers_only_the_tools_it_keeps_on_with_its_own_choice_and_other_chats_keep_the_defaults(
        qtbot, open_window, offered):
    window = open_window()
    window.apply_settings({"system_prompt": None, "sampler": {"temperature": 0.0, "max_tokens": 4}})
    window.preferences.tool_switches = ToolSwitches(frozenset({READ_FILE, SEARCH_CONVERSATIONS}))
    window.configure_tools()
    window.pick_file_for_tools(__file__)  # read_file is offered once a file is picked
    send(qtbot, window, "Chat A")
    chat_a = window.current_id
    window.tool_choice.in_chat[READ_FILE].trigger()  # unchecked in the menu: off in this chat
    window.tool_choice.options["required"].trigger()
    assert window.tool_choice.text() == "Required" and not window.tool_choice.in_chat[READ_FILE].isChecked()
    send(qtbot, window, "Only the search, and a call first")
    assert offered[-1] == ([SEARCH_CONVERSATIONS], "required")

    window.new_chat()
    assert window.tool_choice.text() == "Auto" and window.tool_choice.in_chat[READ_FILE].isChecked()
    window.pick_file_for_tools(__file__)
    send(qtbot, window, "Chat B")
    assert sorted(offered[-1][0]) == sorted([READ_FILE, SEARCH_CONVERSATIONS]) and offered[-1][1] == "auto"
    assert window.store.get_conversation(window.current_id)["tools"] is None

    window.open_conversation(chat_a)
    assert window.tool_choice.text() == "Required" and not window.tool_choice.in_chat[READ_FILE].isChecked()
    window.close()
    again = open_window()  # the same data dir: chat A was the last one open
    assert again.current_id == chat_a and again.tool_choice.text() == "Required"
    again.pick_file_for_tools(__file__)
    send(qtbot, again, "Still only the search")
    assert offered[-1] == ([SEARCH_CONVERSATIONS], "required")
    assert again.store.get_conversation(chat_a)["tools"] == {"enabled": [SEARCH_CONVERSATIONS], "choice": "required"}
