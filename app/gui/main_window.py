"""The main window: the conversation sidebar (collapsible), a header with the model picker and the
settings, the chat (or, for an empty one, the welcome screen), the message input and the status bar, wired
to the engine thread. Everything here runs on the UI thread and only renders, reads the store, or queues requests
for the worker; replies arrive as signals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, NamedTuple

from PySide6.QtCore import QCoreApplication, QEvent, Qt
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (QFileDialog, QFrame, QHBoxLayout, QMainWindow, QMessageBox, QProgressBar,
                               QSplitter, QStackedWidget, QVBoxLayout, QWidget)

from app.gui.attachments import AttachmentBar, FileDrops, choose_documents, paperclip_button
from app.gui.chat_view import ChatView
from app.gui.composer import Composer
from app.gui.document_jobs import DocumentsClient
from app.gui.documents_dialog import DocumentsDialog
from app.gui.icons import IconButton
from app.gui.kernel_warmup import KernelWarmup
from app.gui.message_model import MessageModel
from app.gui.model_picker import ModelPicker, model_label
from app.gui.preferences import Preferences
from app.gui.server_switch import ServerSwitch
from app.gui.settings_dialog import SettingsDialog
from app.gui.sidebar import UNTITLED, Sidebar
from app.gui.status_line import StatusLine, describe_kernel_wait
from app.gui.storage_banner import StorageBanner
from app.gui.theme import SPACE_L, SPACE_M, THEMES, apply_theme
from app.gui.tool_call_block import ToolCallsPanel
from app.gui.tool_choice import ToolChoiceButton
from app.gui.welcome import WelcomeScreen
from app.gui.worker import EngineClient, EngineStatus
from engine.platform.catalog import catalog, starter_of_file
from engine.errors import FucinaError, StoreError
from engine.history.store import HistoryStore
from engine.history.validate import read_export
from engine.platform.paths import data_dir
from engine.runtime import configure_backend

PREFERENCES_FILE = "gui.ini"
THEME_NAMES = {"system": "Follow the system", "light": "Light", "dark": "Dark"}


class HeldTurn(NamedTuple):
    """A turn held until the kernels its model needs are compiled: how it is sent, and the message it sends
    (None: a regeneration or an edit)."""
    send: Callable[[], None]
    text: str | None


class MainWindow(QMainWindow):
    def __init__(self, conversation_id: str | None = None, *, first_run_picker: bool = True,
                 theme: str | None = None):
        """Opens `conversation_id`, else the conversation open when the app last closed. With no model on
        disk the model picker opens (unless not `first_run_picker`) to offer the starter models. `theme`
        overrides the remembered theme for this run only (a screenshot's)."""
        preferences = Preferences(data_dir() / PREFERENCES_FILE)
        theme = theme or preferences.theme
        apply_theme(theme)  # before the window exists: its widgets are built in the theme's colours
        super().__init__()
        self.setWindowTitle("Fucina")
        self.resize(1100, 760)
        db_path = HistoryStore.default_path()
        self.store = HistoryStore(db_path)
        self.preferences, self.theme = preferences, theme
        # before the first model loads; a backend that cannot start says so once and the CPU runs
        configure_backend(self.preferences.backend,
                          lambda message: QMessageBox(QMessageBox.Icon.Warning, "Backend", message, parent=self).open())
        self.client = EngineClient(db_path)
        self.current_id: str | None = None
        self.model_path: str | None = None       # the model the engine has loaded (or the remote endpoint's)
        self.model_requested = False              # a model load was asked for (it may still fail)
        self._new_chat_settings: dict = {}        # settings chosen for a chat not saved yet
        self._pending_jump: str | None = None     # a search hit to show once its branch is
        self._held_turn: HeldTurn | None = None   # a turn waiting for the kernel warm-up

        self.sidebar = Sidebar(self.store)
        self.chat_model = MessageModel(self._siblings)  # the active branch, and whether a reply streams
        self.chat_view = ChatView(self.chat_model)
        self.welcome = WelcomeScreen()
        self.composer = Composer()
        self.sidebar_button = IconButton("sidebar", "Toggle sidebar", "Show or hide the conversations (Ctrl+B)")
        self.new_chat_button = IconButton("new-chat", "New chat", "Start a new conversation (Ctrl+N)")
        self.model_button = IconButton("model", "Choose model", "Choose the model", text="No model")
        self.model_button.setObjectName("modelButton")
        self.settings_button = IconButton("settings", "Conversation settings",
                                          "System prompt, sampling and context (Ctrl+,)")
        self.status_line = StatusLine()
        self.storage_banner = StorageBanner()
        self.load_progress = QProgressBar()
        self.load_progress.setRange(0, 0)
        self.load_progress.setMaximumWidth(140)
        self.load_progress.setAccessibleName("Model loading")
        self.load_progress.hide()
        self.kernel_warmup = KernelWarmup(self)
        self.documents = DocumentsClient(self.client.worker.documents)
        self.attachment_bar = AttachmentBar()
        self.tool_calls = ToolCallsPanel()  # a reply's tool calls, each asked about before it runs
        self.attach_button = paperclip_button()
        self.tool_choice = ToolChoiceButton(self.preferences.tool_choice)  # how replies use the tools switched on
        self.file_drops = FileDrops(self)
        self._build_layout()
        self._build_menus()
        self._connect()
        if self.preferences.geometry is not None:
            self.restoreGeometry(self.preferences.geometry)
        self.client.set_speculation(self.preferences.speculation)
        self.client.set_tool_choice(self.preferences.tool_choice)
        self.client.set_expert_cache(self.preferences.expert_cache)
        self.documents.set_disk_budget(self.preferences.disk_budget)
        self.configure_tools()
        self.open_conversation(conversation_id or self.preferences.last_conversation)
        self._load_initial_model(first_run_picker)

    # -- construction ------------------------------------------------------------------------------
    def _build_layout(self) -> None:
        header = QFrame()
        header.setObjectName("header")
        top = QHBoxLayout(header)
        top.setContentsMargins(SPACE_M, SPACE_M - 2, SPACE_L, SPACE_M - 2)
        top.setSpacing(2)
        for widget in (self.sidebar_button, self.new_chat_button):
            top.addWidget(widget)
        top.addSpacing(SPACE_M)
        top.addWidget(self.model_button)
        top.addStretch()
        top.addWidget(self.settings_button)
        self.chat_stack = QStackedWidget()  # the chat, or the welcome screen while it is empty
        self.chat_stack.addWidget(self.welcome)
        self.chat_stack.addWidget(self.chat_view)
        right = QWidget()
        column = QVBoxLayout(right)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(header)
        column.addWidget(self.attachment_bar)
        column.addWidget(self.chat_stack, 1)
        column.addWidget(self.tool_calls)
        column.addWidget(self.composer)
        self.sidebar.setObjectName("sidebarPane")
        self.sidebar.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)  # its background from the style sheet
        self.sidebar.setVisible(self.preferences.sidebar_visible)
        splitter = QSplitter()
        splitter.setHandleWidth(0)  # the sidebar's border is the divider
        splitter.addWidget(self.sidebar)
        splitter.addWidget(right)
        splitter.setStretchFactor(1, 1)
        splitter.setCollapsible(1, False)
        splitter.setSizes([260, 840])
        central = QWidget()
        window_column = QVBoxLayout(central)
        window_column.setContentsMargins(0, 0, 0, 0)
        window_column.setSpacing(0)
        window_column.addWidget(self.storage_banner)
        window_column.addWidget(splitter, 1)
        self.setCentralWidget(central)
        self.composer.tools.addWidget(self.attach_button)
        self.composer.tools.addWidget(self.tool_choice)
        self.statusBar().addWidget(self.status_line, 1)
        self.statusBar().addPermanentWidget(self.load_progress)
        self.statusBar().addPermanentWidget(self.kernel_warmup.bar)

    def _action(self, menu, text: str, slot, shortcut=None) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        action.triggered.connect(slot)
        menu.addAction(action)
        return action

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file = bar.addMenu("&File")
        self._action(file, "New chat", self.new_chat, QKeySequence.StandardKey.New)
        self._action(file, "Attach document…", self.choose_documents, QKeySequence.StandardKey.Open)
        self._action(file, "Documents…", self.open_documents)
        self._action(file, "Import conversation (JSON)…", self.import_conversation)
        self._action(file, "Export conversation…", lambda: self.export_conversation(self.current_id))
        file.addSeparator()
        self._action(file, "Quit", self.close, QKeySequence.StandardKey.Quit)
        edit = bar.addMenu("&Edit")
        self._action(edit, "Copy last reply", self.copy_last_reply, "Ctrl+Shift+C")
        self._action(edit, "Search", self.sidebar.focus_search, "Ctrl+K")
        chat = bar.addMenu("&Chat")
        self._action(chat, "Settings…", self.edit_settings, "Ctrl+,")
        self._action(chat, "Choose model…", self.choose_model)
        self._action(chat, "Let tools read a file…", self.pick_file_for_tools)
        self._action(chat, "Stop reply", self.stop_reply, "Esc")
        view = bar.addMenu("&View")
        self._action(view, "Sidebar", self.toggle_sidebar, "Ctrl+B")
        themes = view.addMenu("Theme")
        self.theme_actions = QActionGroup(self)
        for name in THEMES:
            action = self._action(themes, THEME_NAMES[name], lambda _=False, n=name: self.set_theme(n))
            action.setCheckable(True)
            action.setChecked(name == self.theme)
            self.theme_actions.addAction(action)

    def _connect(self) -> None:
        self.sidebar.new_requested.connect(self.new_chat)
        self.sidebar.conversation_chosen.connect(self.open_conversation)
        self.sidebar.message_chosen.connect(self.jump_to_message)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        self.sidebar.export_requested.connect(self.export_conversation)
        self.composer.send_requested.connect(self.send)
        self.composer.stop_requested.connect(self.stop_reply)
        self.chat_view.regenerate_requested.connect(self.regenerate)
        self.chat_view.edit_requested.connect(self.edit)
        self.chat_view.delete_requested.connect(self.client.delete_message)
        self.chat_view.switch_requested.connect(self.client.switch)
        self.model_button.clicked.connect(self.choose_model)
        self.sidebar_button.clicked.connect(self.toggle_sidebar)
        self.new_chat_button.clicked.connect(self.new_chat)
        self.welcome.prompt_chosen.connect(self.send_example)
        for shown_changed in (self.chat_model.modelReset, self.chat_model.rowsInserted, self.chat_model.rowsRemoved):
            shown_changed.connect(self._show_welcome_if_empty)
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._system_scheme_changed)
        self.settings_button.clicked.connect(self.edit_settings)
        self.storage_banner.retry_requested.connect(self.client.save_pending)
        self.sidebar.storage_failed.connect(lambda message: self.storage_banner.show_failure(message, None))
        self.attach_button.clicked.connect(self.choose_documents)
        self.tool_choice.chosen.connect(self.set_tool_choice)
        self.tool_choice.chat_tools_changed.connect(self.client.set_chat_tools)
        self.file_drops.dropped.connect(self.attach_files)
        self.attachment_bar.remove_requested.connect(self.documents.remove)
        self.client.worker.documents.chips_changed.connect(self.attachment_bar.show_chips)
        self.kernel_warmup.progress_changed.connect(self._kernel_progress)
        self.kernel_warmup.finished.connect(self._send_held_turn)
        worker = self.client.worker
        worker.model_loading.connect(self._model_loading)
        worker.model_loaded.connect(self._model_loaded)
        worker.model_failed.connect(self._model_failed)
        worker.remote_connected.connect(self._remote_connected)
        worker.remote_failed.connect(self._remote_failed)
        worker.conversation_ready.connect(self._conversation_ready)
        worker.conversation_created.connect(self._conversation_created)
        worker.conversation_deleted.connect(self._conversation_deleted)
        worker.reply_text.connect(self._reply_text)
        worker.reply_reasoning.connect(self._reply_reasoning)
        worker.turn_finished.connect(self._turn_finished)
        worker.prefill_progress.connect(self._prefill_progress)
        worker.reply_progress.connect(self._reply_progress)
        worker.branch_changed.connect(self._refresh_if_current)
        worker.branch_changed.connect(self.sidebar.conversation_changed)  # a switch moves it up the list
        worker.status_changed.connect(self._status_changed)
        worker.failed.connect(self._engine_failed)  # a bound slot, so it runs on this (the UI) thread
        worker.storage_failed.connect(self._storage_failed)
        worker.storage_recovered.connect(self.storage_banner.clear)
        worker.tool_allowed_always.connect(self._tool_allowed_always)
        worker.approvals.requested.connect(self.tool_calls.ask)
        worker.approvals.finished.connect(self.tool_calls.show_result)
        # a call asked about or run ends the reply's reasoning, though no answer text (the call's) is shown
        worker.approvals.requested.connect(self.chat_view.reasoning_ended)
        worker.approvals.finished.connect(self.chat_view.reasoning_ended)

    def _siblings(self, message_id: str) -> list[str]:
        return [m["id"] for m in self.store.siblings(message_id)]

    # -- conversations -----------------------------------------------------------------------------
    def open_conversation(self, conversation_id: str | None) -> None:
        self._show_conversation(conversation_id)
        self.tool_calls.clear()
        self.client.open_conversation(self.current_id)

    def new_chat(self) -> None:
        self.open_conversation(None)

    def _show_conversation(self, conversation_id: str | None) -> None:
        """Show a conversation (None: a new, empty chat) from the store, without asking the engine."""
        if conversation_id is not None:
            try:
                self.store.get_conversation(conversation_id)
            except FucinaError:  # deleted since it was remembered
                conversation_id = None
        self._end_turn()
        self.current_id, self._new_chat_settings = conversation_id, {}
        self.attachment_bar.show_notice("")
        self.preferences.last_conversation = conversation_id
        if conversation_id is None:
            self.chat_model.clear()
        else:  # another conversation's branch resets the chat once
            self._refresh_if_current(conversation_id)
        self.tool_choice.show_chat(conversation_id and self.store.get_conversation(conversation_id)["tools"])
        self.sidebar.select(conversation_id)
        self.composer.input.setFocus()

    def _refresh_if_current(self, conversation_id: str | None) -> None:
        """Show the stored branch; while a reply streams the view is the turn's until it ends."""
        if conversation_id is None or conversation_id != self.current_id or self.streaming:
            return
        self.chat_model.show_branch(self.store.active_branch(conversation_id))
        if self._pending_jump and self.chat_view.scroll_to_message(self._pending_jump):
            self._pending_jump = None
        title = self.store.get_conversation(conversation_id)["title"] or UNTITLED
        self.setWindowTitle(f"{title} — Fucina")

    def jump_to_message(self, conversation_id: str, message_id: str) -> None:
        if conversation_id != self.current_id:
            self.open_conversation(conversation_id)
        if self.chat_view.scroll_to_message(message_id) is None:  # on another branch: show that one
            self._pending_jump = message_id
            self.client.switch(message_id)

    def _conversation_ready(self, conversation_id: str | None) -> None:
        self._refresh_if_current(conversation_id)  # after a model switch the history re-renders

    def _conversation_created(self, conversation_id: str, turn) -> None:
        if turn is self.client.current_turn:
            self.current_id = conversation_id
            self.preferences.last_conversation = conversation_id
        self.sidebar.conversation_changed(conversation_id)
        self.sidebar.select(self.current_id)

    def delete_conversation(self, conversation_id: str) -> None:
        if conversation_id == self.current_id:
            self.new_chat()  # stops a reply still being written into it
        self.client.delete_conversation(conversation_id)

    def _conversation_deleted(self, conversation_id: str) -> None:
        self.sidebar.conversation_removed(conversation_id)
        if conversation_id == self.current_id:
            self._show_conversation(None)  # the engine closed it already

    # -- turns -------------------------------------------------------------------------------------
    def send(self, text: str) -> None:
        self._begin_turn(self.chat_model.rowCount(), text)
        self._when_kernels_ready(lambda: self.client.send(text), text)

    def regenerate(self) -> None:
        """A new reply in place of the last one (or to a last user message that has none)."""
        messages = self.chat_model.messages
        if self.streaming or not messages:
            return
        self._begin_turn(len(messages) - (messages[-1]["role"] == "assistant"))
        self._when_kernels_ready(self.client.regenerate)

    def edit(self, message_id: str, text: str) -> None:
        if self.streaming or not text.strip():
            return
        self._begin_turn(self.chat_model.row_of(message_id), text)
        self._when_kernels_ready(lambda: self.client.edit(message_id, text))

    def send_example(self, text: str) -> None:
        """An example prompt from the welcome screen: sent, or put in the message box while no model can
        answer yet."""
        if self.composer.ready and not self.streaming:
            self.send(text)
        else:
            self.composer.input.setPlainText(text)
            self.composer.input.setFocus()

    def _show_welcome_if_empty(self) -> None:
        self.chat_stack.setCurrentWidget(self.chat_view if self.chat_model.rowCount() else self.welcome)

    @property
    def streaming(self) -> bool:
        """A reply is being written: the chat's model holds that state, the rest of the window reads it."""
        return self.chat_model.streaming

    def _begin_turn(self, keep: int, user_text: str | None = None) -> None:
        """While a reply streams, sending and the actions that change the branch wait for it."""
        response_format = (self.current_settings().get("sampler") or {}).get("response_format")
        self.chat_model.begin_reply(keep, user_text, response_format and response_format["type"])
        self.composer.set_busy(True)

    def _status_changed(self, status: EngineStatus) -> None:
        """The engine's numbers, shown unless a turn's progress holds the line (they show when it ends): a late
        one, from the model's load or a document, must not blank a reply's wait for its kernels."""
        if self.streaming:
            self.status_line.status = status
        else:
            self.status_line.show_status(status)

    def _end_turn(self) -> None:
        held, self._held_turn = self._held_turn, None
        self.chat_model.end_reply()
        self.tool_calls.turn_ended()
        self.composer.set_busy(False)
        self.status_line.show_status(self.status_line.status)
        if held is None:
            return
        # a held turn never reached the engine: the chat shows what is stored, and its message is not lost
        if self.current_id is None:
            self.chat_model.clear()
        self._refresh_if_current(self.current_id)
        if held.text and not self.composer.input.toPlainText().strip():
            self.composer.input.setPlainText(held.text)

    def stop_reply(self) -> None:
        if self._held_turn is not None:
            self._end_turn()
        self.client.stop()

    def _when_kernels_ready(self, send: Callable[[], None], text: str | None = None) -> None:
        """Send a turn, or hold it while the warm-up compiles the kernels its model needs (the reply would
        compile them itself, racing the warm-up); meanwhile its reply and the status line say so."""
        if not self.kernel_warmup.warms(self.model_path):
            send()
            return
        self._held_turn = HeldTurn(send, text)
        self._kernel_progress(self.kernel_warmup.progress)

    def _kernel_progress(self, progress: float) -> None:
        if self._held_turn is not None:
            self.chat_view.show_wait(describe_kernel_wait(progress))
            self.status_line.show_kernel_wait(progress)

    def _send_held_turn(self) -> None:
        held, self._held_turn = self._held_turn, None
        if held is not None:
            self.chat_view.show_wait(None)
            held.send()

    def _reply_text(self, text: str, turn) -> None:
        if self.streaming and turn is self.client.current_turn:
            self.chat_model.append_reply(text)

    def _reply_reasoning(self, text: str, turn) -> None:
        if self.streaming and turn is self.client.current_turn:
            self.chat_model.append_reasoning(text)

    def _prefill_progress(self, progress, turn) -> None:
        if self.streaming and turn is self.client.current_turn:
            kernel = progress.compiling_kernel
            self.chat_view.show_wait(describe_kernel_wait(kernel=kernel) if kernel else None)
            self.status_line.show_prefill(progress)

    def _reply_progress(self, progress, turn) -> None:
        if self.streaming and turn is self.client.current_turn:
            self.status_line.show_reply(progress)

    def _turn_finished(self, conversation_id: str | None, turn) -> None:
        if turn is self.client.current_turn:
            self._end_turn()
            if conversation_id is None:  # the turn never started (the engine said why)
                self.chat_model.clear()
            if self.storage_banner.reply is None:  # else the view keeps the reply the store has not got yet
                self._refresh_if_current(conversation_id)
        if conversation_id is not None:  # a first message titles it, and every turn moves it up the list
            self.sidebar.conversation_changed(conversation_id)

    def _storage_failed(self, message: str, reply: str | None, unsent: str | None) -> None:
        self.storage_banner.show_failure(message, reply)
        if unsent and not self.composer.input.toPlainText().strip():  # the message is not lost: type it again
            self.composer.input.setPlainText(unsent)

    def copy_last_reply(self) -> None:
        text = self.chat_model.last_reply_text()
        if text:
            QGuiApplication.clipboard().setText(text)

    def _engine_failed(self, message: str) -> None:
        self.show_error("Fucina", message)

    # -- models ------------------------------------------------------------------------------------
    def _load_initial_model(self, first_run_picker: bool) -> None:
        if self.preferences.remote_in_use and self.preferences.remote_endpoint["url"]:
            self.use_remote(self.preferences.remote_endpoint)
            return
        recent = [p for p in self.preferences.recent_models if Path(p).is_file()]
        downloaded = next((m for m in catalog().values() if m.is_downloaded()), None)  # the first offered
        if recent:
            self.load_model(recent[0])
        elif downloaded is not None:
            self.load_model(str(downloaded.path()))
        elif first_run_picker:
            self.choose_model(first_run=True)

    def choose_model(self, first_run: bool = False) -> ModelPicker:
        picker = ModelPicker(self.preferences.recent_models, self, first_run=first_run, in_use=self.model_path,
                             remote=self.preferences.remote_endpoint, speeds=self.store.decode_speeds())
        picker.model_chosen.connect(self.load_model)
        picker.remote_chosen.connect(self.use_remote)
        picker.download_started.connect(self.kernel_warmup.start)  # compiles while the model downloads
        picker.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        picker.open()
        return picker

    def load_model(self, path: str) -> None:
        if self.streaming:  # the engine stops the reply; what was written is in the store
            self._end_turn()
        self.model_requested = True
        starter = starter_of_file(path)
        if starter is not None:  # its kernels compile while it loads (on the first run; nothing once done)
            self.kernel_warmup.start(starter.name)
        self.client.load_model(path)

    def use_remote(self, endpoint: dict) -> None:
        """Chat through a remote endpoint (remembered, with its key, for the next start)."""
        if self.streaming:
            self._end_turn()
        self.preferences.remote_endpoint = endpoint
        self.model_requested = True
        self._model_loading(endpoint.get("url", ""))
        self.client.use_remote(endpoint)

    def _remote_connected(self, name: str) -> None:
        self.model_path = name
        self.preferences.remote_in_use = True
        self.load_progress.hide()
        self.statusBar().clearMessage()
        self.model_button.setText(name)
        self.composer.set_ready(True)

    def _remote_failed(self, message: str) -> None:
        self._model_failed("", message, title="Cannot use the remote endpoint",
                           what="The remote endpoint cannot answer the chats")

    def _model_loading(self, path: str) -> None:
        self.composer.set_ready(False)
        self.load_progress.show()
        self.statusBar().showMessage(f"Loading {model_label(path)}…")

    def _model_loaded(self, path: str) -> None:
        self.model_path = path
        self.preferences.add_recent_model(path)
        self.preferences.remote_in_use = False
        self.load_progress.hide()
        self.statusBar().clearMessage()
        self.model_button.setText(model_label(path))
        self.composer.set_ready(True)  # a reply asked for while the first run's kernels compile waits for them

    def _model_failed(self, path: str, message: str, *, title: str = "Cannot open model",
                      what: str | None = None) -> None:
        self.load_progress.hide()
        self.statusBar().clearMessage()
        self.composer.set_ready(self.model_path is not None)
        still = (f"Still using {self.model_button.text()}." if self.model_path
                 else "Choose another model to start chatting.")
        what = what or f"{Path(path).name} could not be loaded"
        self.show_error(title, f"{what}:\n\n{message}\n\n{still}")

    # -- documents ---------------------------------------------------------------------------------
    def attach_files(self, paths: list[str]) -> None:
        """Read the files into the chat on screen; documents attach before a chat's first message, so a chat
        with turns makes way for a new one (which says so)."""
        if not paths:
            return
        if self.current_id is not None or self.chat_model.rowCount() or self.streaming:
            self.new_chat()
            names = ", ".join(Path(p).name for p in paths)
            self.attachment_bar.show_notice(f"Documents attach to a chat before its first message: a new chat was "
                                            f"started for {names}")
        for path in paths:
            self.documents.attach(path)

    def choose_documents(self) -> None:
        self.attach_files(choose_documents(self))

    def open_documents(self) -> DocumentsDialog:
        dialog = DocumentsDialog(self.preferences.disk_budget, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def set_expert_cache(self, budget: int | None) -> None:
        """The memory for a streamed model's experts (None: automatic), from the next model load."""
        self.preferences.expert_cache = budget
        self.client.set_expert_cache(budget)

    def set_disk_budget(self, budget: int) -> None:
        if budget != self.preferences.disk_budget:
            self.preferences.disk_budget = budget
            self.documents.set_disk_budget(budget)

    # -- settings, import and export ---------------------------------------------------------------
    def current_settings(self) -> dict:
        if self.current_id is None:
            return self._new_chat_settings
        conv = self.store.get_conversation(self.current_id)
        return {"system_prompt": conv["system_prompt"], "sampler": conv["sampler"]}

    def edit_settings(self) -> SettingsDialog:
        dialog = SettingsDialog(self.current_settings(), self.preferences, self,
                                server_switch=ServerSwitch(self.client, self.preferences))
        dialog.accepted.connect(lambda: self.apply_settings(dialog.settings()))
        dialog.accepted.connect(lambda: self.set_speculation(dialog.speculation.isChecked()))
        dialog.accepted.connect(lambda: self.set_disk_budget(dialog.disk_budget_bytes()))
        dialog.accepted.connect(lambda: setattr(self.preferences, "backend", dialog.backend.currentText()))
        dialog.accepted.connect(lambda: self.set_expert_cache(dialog.expert_cache_bytes()))
        dialog.tools_changed.connect(self.configure_tools)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def apply_settings(self, settings: dict) -> None:
        current = self.current_settings()
        changed = {key: value for key, value in settings.items() if current.get(key) != value}
        if self.current_id is None:
            self._new_chat_settings = {**current, **changed}
        if changed:  # a new sampler reopens the engine's cache: only for a real change
            self.client.update_settings(changed)

    def pick_file_for_tools(self, path: str | None = None) -> None:
        """The one file the read_file tool may read in this chat (switched on in the tools' settings)."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Let tools read a file", str(Path.home()))
            if not path:
                return
        self.client.pick_file(path)
        self.statusBar().showMessage(f"Tools may read {Path(path).name} in this chat", 5000)

    def configure_tools(self) -> None:
        """The tools' settings (saved by app.gui.tools_dialog) to the engine thread, and the tools switched on
        to the tool choice."""
        self.client.configure_tools(self.preferences.mcp_servers, self.preferences.tool_switches)
        self.tool_choice.show_tools(sorted(self.preferences.tool_switches.enabled))

    def set_tool_choice(self, choice: str) -> None:
        """The app's default choice: shown on the tool choice button while the open chat has none of its own,
        remembered for the next start, and used from the next turn on in the chats without their own."""
        self.tool_choice.set_default(choice)
        if choice != self.preferences.tool_choice:
            self.preferences.tool_choice = choice
            self.client.set_tool_choice(choice)

    def _tool_allowed_always(self, name: str) -> None:
        self.preferences.tool_switches = self.preferences.tool_switches.allowed_always(name)

    def set_speculation(self, on: bool) -> None:
        """Remembered for the next start, and used from the next reply on."""
        if on != self.preferences.speculation:
            self.preferences.speculation = on
            self.client.set_speculation(on)

    def export_conversation(self, conversation_id: str | None) -> None:
        if conversation_id is None:
            return
        title = self.store.get_conversation(conversation_id)["title"] or "conversation"
        path, chosen = QFileDialog.getSaveFileName(self, "Export conversation", str(Path.home() / title),
                                                   "Markdown (*.md);;JSON (*.json)")
        if not path:
            return
        as_json = path.endswith(".json") or (not path.endswith(".md") and chosen.startswith("JSON"))
        if as_json:
            text = json.dumps(self.store.export_json(conversation_id), indent=2, ensure_ascii=False)
        else:
            text = self.store.export_markdown(conversation_id)
        try:
            Path(path).write_text(text, encoding="utf-8")
        except OSError as e:
            self.show_error("Export failed", str(e))

    def import_conversation(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import conversation", str(Path.home()), "JSON (*.json)")
        if not path:
            return
        try:
            conversation_id = self.store.import_json(read_export(path))
        except StoreError as e:
            self.storage_banner.show_failure(str(e), None)
            return
        except FucinaError as e:
            self.show_error("Import failed", f"{Path(path).name}: {e}")
            return
        self.open_conversation(conversation_id)

    # -- window ------------------------------------------------------------------------------------
    def set_theme(self, theme: str) -> None:
        """Switch the look now and remember it for the next start."""
        self.theme = self.preferences.theme = theme
        for action in self.theme_actions.actions():
            action.setChecked(action.text() == THEME_NAMES[theme])
        apply_theme(theme)

    def _system_scheme_changed(self, _scheme) -> None:
        if self.theme == "system":
            apply_theme("system")

    def toggle_sidebar(self) -> None:
        visible = self.sidebar.isHidden()
        self.sidebar.setVisible(visible)
        self.preferences.sidebar_visible = visible

    def show_error(self, title: str, text: str) -> QMessageBox:
        """A window-modal error that does not block the event loop (replies keep streaming behind it)."""
        box = QMessageBox(QMessageBox.Icon.Critical, title, text, QMessageBox.StandardButton.Ok, self)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        return box

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange and not self.closed:  # the theme changed: re-render
            self.chat_view.rebuild()
        super().changeEvent(event)

    @property
    def closed(self) -> bool:
        """Closed before: the engine's thread has ended and the store is closed."""
        return self.client.thread.isFinished()

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.closed:
            return super().closeEvent(event)
        self.preferences.geometry = self.saveGeometry()
        self.preferences.last_conversation = self.current_id
        self.preferences.sync()
        for picker in self.findChildren(ModelPicker):  # a download still running stops and its thread ends
            picker.reject()
        self.kernel_warmup.stop()
        self.client.close()
        # the worker's last signals (queued for this thread) run now, while the store is still open
        QCoreApplication.sendPostedEvents(None, QEvent.Type.MetaCall)
        self.store.close()
        super().closeEvent(event)
