"""The Documents library: the cartridges read so far (document, model, tokens, size on disk, last used),
most recently used first, and deleting them. A deleted document is simply read again the next time a chat
attaches it; the disk budget (Settings) evicts the least recently used ones on its own."""

from __future__ import annotations

from datetime import datetime

from PySide6.QtWidgets import (QAbstractItemView, QDialog, QDialogButtonBox, QHBoxLayout, QLabel, QMessageBox,
                               QPushButton, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from engine.cartridge import store
from engine.errors import StoreError

COLUMNS = ("Document", "Model", "Tokens", "Size on disk", "Last used")


def _size(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


class DocumentsDialog(QDialog):
    def __init__(self, disk_budget: int, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Documents")
        self.resize(760, 380)
        self.disk_budget = disk_budget
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setAccessibleName("Stored documents")
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.usage = QLabel()
        self.delete_button = QPushButton("Delete")
        self.delete_button.setAccessibleName("Delete the selected documents")
        self.delete_button.clicked.connect(self.delete_selected)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        row = QHBoxLayout()
        row.addWidget(self.usage, 1)
        row.addWidget(self.delete_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addLayout(row)
        layout.addWidget(buttons)
        self.refresh()

    def refresh(self) -> None:
        self.cartridges = store.stored()
        self.table.setRowCount(len(self.cartridges))
        for i, c in enumerate(self.cartridges):
            cells = (c.name or c.id, c.model or f"model {c.fingerprint[:12]}", f"{c.rows:,}", _size(c.bytes),
                     datetime.fromtimestamp(c.used_at).strftime("%Y-%m-%d %H:%M"))
            for j, text in enumerate(cells):
                self.table.setItem(i, j, QTableWidgetItem(text))
        used = sum(c.bytes for c in self.cartridges)
        self.usage.setText(f"{len(self.cartridges)} documents, {_size(used)} of the {_size(self.disk_budget)} "
                           "disk budget (Settings); the least recently used go first")
        self.delete_button.setEnabled(bool(self.cartridges))

    def delete_selected(self) -> None:
        rows = sorted({index.row() for index in self.table.selectionModel().selectedRows()})
        try:
            for i in rows:
                store.delete(self.cartridges[i])
        except StoreError as e:
            QMessageBox.warning(self, "Cannot delete", str(e))
        self.refresh()
