"""The status bar's numbers: context used of available, time to first token, decode speed, and whether
the reply continued a warm KV cache (reused positions) or had to prefill the history again."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel

from app.gui.worker import EngineStatus


def describe(status: EngineStatus) -> str:
    parts = [f"context {status.context_used:,} / {status.context_size:,}"] if status.context_size else []
    if status.ttft_ms is not None:
        parts.append(f"first token {status.ttft_ms:,.0f} ms")
        parts.append(f"{status.decode_tps:.1f} tok/s")
        warmth = "warm" if status.reused_tokens else "cold"
        parts.append(f"{warmth}: {status.reused_tokens:,} reused, {status.prefilled_tokens:,} prefilled")
    elif status.context_size:
        parts.append(f"resumed warm ({status.resumed_positions:,} positions)" if status.resumed_positions
                     else "cold start")
    return "  ·  ".join(parts)


class StatusLine(QLabel):
    def __init__(self):
        super().__init__()
        self.setAccessibleName("Reply statistics")
        self.status = EngineStatus()

    def show_status(self, status: EngineStatus) -> None:
        self.status = status
        self.setText(describe(status))
