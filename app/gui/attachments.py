"""The conversation header's attachments: one chip per document (name, tokens, reading N% / ready / failed
and why) with an x that stops the reading or takes the document off; the paperclip button; and the window
taking files dropped on it."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtWidgets import QFileDialog, QFrame, QHBoxLayout, QLabel, QProgressBar, QToolButton, QWidget

from app.gui.document_jobs import FAILED, READING, Chip
from app.gui.icons import IconButton

# what the open dialog offers (ingest reads any text file too: "All files")
DOCUMENT_FILTER = ("Documents (*.txt *.md *.markdown *.rst *.html *.htm *.pdf *.docx *.py *.js *.ts *.c *.h *.cpp "
                   "*.java *.rs *.go *.json *.csv *.safetensors);;All files (*)")
REASON_CHARS = 60  # a failed chip shows the start of why; its tooltip the whole


def chip_text(chip: Chip) -> str:
    if chip.state == READING:
        return f"{chip.name} · reading {chip.percent}%"
    if chip.state == FAILED:
        reason = chip.reason if len(chip.reason) <= REASON_CHARS else chip.reason[: REASON_CHARS - 1] + "…"
        return f"{chip.name} · failed — {reason}"
    return f"{chip.name} · {chip.tokens:,} tokens"


class ChipWidget(QFrame):
    remove_requested = Signal(object)  # the Chip

    def __init__(self, chip: Chip):
        super().__init__()
        self.chip = chip
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAccessibleName(f"Attachment {chip.name}")
        self.label = QLabel(chip_text(chip))
        self.setToolTip(chip.reason or chip.name)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setValue(chip.percent)
        self.progress.setTextVisible(False)
        self.progress.setFixedWidth(60)
        self.progress.setVisible(chip.state == READING)
        self.close_button = QToolButton(text="×")
        action = "Stop reading" if chip.state == READING else "Remove"
        self.close_button.setAccessibleName(f"{action} {chip.name}")
        self.close_button.setToolTip(f"{action} {chip.name}")
        self.close_button.clicked.connect(lambda: self.remove_requested.emit(self.chip))
        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 2, 2, 2)
        layout.addWidget(self.label)
        layout.addWidget(self.progress)
        layout.addWidget(self.close_button)


class AttachmentBar(QWidget):
    """The chips of the chat on screen, and a line saying what attaching did (a new chat started for it)."""
    remove_requested = Signal(object)  # a Chip

    def __init__(self):
        super().__init__()
        self.setAccessibleName("Attached documents")
        self.chips: list[ChipWidget] = []
        self.notice = QLabel()
        self.notice.setEnabled(False)  # the palette's muted text
        self.notice.hide()
        self._row = QHBoxLayout(self)
        self._row.setContentsMargins(12, 0, 12, 0)
        self._row.addWidget(self.notice)
        self._row.addStretch()
        self.hide()

    def show_chips(self, chips: list[Chip]) -> None:
        for widget in self.chips:
            widget.deleteLater()
        self.chips = [ChipWidget(chip) for chip in chips]
        for i, widget in enumerate(self.chips):
            widget.remove_requested.connect(self.remove_requested)
            self._row.insertWidget(i, widget)
        self._update_visibility()

    def show_notice(self, text: str) -> None:
        self.notice.setText(text)
        self.notice.setVisible(bool(text))
        self._update_visibility()

    def _update_visibility(self) -> None:
        self.setVisible(bool(self.chips) or self.notice.isVisible())


def paperclip_button() -> IconButton:
    return IconButton("paperclip", "Attach a document", "Attach a document (Ctrl+O), or drop a file on the chat")


def choose_documents(parent: QWidget) -> list[str]:
    paths, _ = QFileDialog.getOpenFileNames(parent, "Attach documents", "", DOCUMENT_FILTER)
    return paths


class FileDrops(QObject):
    """Files dropped on a widget (the chat window): `dropped` with their paths. Other drags (text) pass."""
    dropped = Signal(list)

    def __init__(self, widget: QWidget):
        super().__init__(widget)
        widget.setAcceptDrops(True)
        widget.installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:
        if event.type() in (QEvent.Type.DragEnter, QEvent.Type.DragMove):
            if _local_files(event.mimeData()):
                event.setDropAction(Qt.DropAction.CopyAction)
                event.accept()
                return True
        elif event.type() == QEvent.Type.Drop:
            paths = _local_files(event.mimeData())
            if paths:
                event.acceptProposedAction()
                self.dropped.emit(paths)
                return True
        return super().eventFilter(watched, event)


def _local_files(mime) -> list[str]:
    return [url.toLocalFile() for url in mime.urls() if url.isLocalFile()] if mime.hasUrls() else []
