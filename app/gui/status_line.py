"""The status bar's numbers: context used of available, the oldest turns the context leaves out, time to
first token, decode speed, whether the reply continued a warm KV cache (reused positions) or had to
prefill the history again, for a speculative reply its tokens per step and draft acceptance, and the
backend the model runs on; while a long prompt is read, how far the engine has got."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel

from app.gui.worker import EngineStatus, PrefillProgress

SEPARATOR = "  ·  "


def _left_out(turns: int) -> list[str]:
    return [f"context full: {turns:,} oldest turn{'s' * (turns != 1)} left out"] if turns else []


def _speculation(status: EngineStatus) -> list[str]:
    if status.spec_tokens_per_step is None:  # a plain reply
        return []
    accepted = ("nothing drafted" if status.spec_acceptance is None
                else f"{status.spec_acceptance:.0%} of drafts accepted")
    return [f"speculative: {status.spec_tokens_per_step:.2f} tokens/step, {accepted}"]


def describe(status: EngineStatus) -> str:
    parts = [f"context {status.context_used:,} / {status.context_size:,}"] if status.context_size else []
    parts += _left_out(status.left_out_turns)
    if status.ttft_ms is not None and not status.ttft_ms:  # the turn ended before its first token
        parts.append("stopped while reading the message" if status.finish_reason == "cancelled"
                     else "no reply")
    elif status.ttft_ms is not None:
        parts.append(f"first token {status.ttft_ms:,.0f} ms")
        parts.append(f"{status.decode_tps:.1f} tok/s")
        warmth = "warm" if status.reused_tokens else "cold"
        parts.append(f"{warmth}: {status.reused_tokens:,} reused, {status.prefilled_tokens:,} prefilled")
        parts += _speculation(status)
    elif status.context_size:
        parts.append(f"resumed warm ({status.resumed_positions:,} positions)" if status.resumed_positions
                     else "cold start")
    if status.backend:
        parts.append(f"on {status.backend}")
    return SEPARATOR.join(parts)


def describe_prefill(progress: PrefillProgress) -> str:
    reading = (f"reading your message: {progress.done:,} / {progress.total:,} tokens"
               if progress.done < progress.total else "writing the reply…")
    return SEPARATOR.join([*_left_out(progress.left_out_turns), reading])


class StatusLine(QLabel):
    def __init__(self):
        super().__init__()
        self.setAccessibleName("Reply statistics")
        self.status = EngineStatus()

    def show_status(self, status: EngineStatus) -> None:
        self.status = status
        self.setText(describe(status))

    def show_prefill(self, progress: PrefillProgress) -> None:
        self.setText(describe_prefill(progress))
