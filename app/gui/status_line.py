"""The status bar's numbers: context used of available, the oldest turns the context leaves out, time to
first token, decode speed, whether the reply continued a warm KV cache (reused positions) or had to
prefill the history again, for a speculative reply its tokens per step and draft acceptance, for a model
streaming its experts from disk the speed to expect (until its first reply) and then the share of the routed
experts found in memory, and the backend the model runs on. While a turn runs it shows that turn's progress
instead: how far the prompt is read (and the time left, estimated from the rate so far), then the reply's
tokens and live decode speed. While a reply waits for kernels to compile (the first run's warm-up, or a kernel
the reading compiles itself), it says so, with how far they are."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel

from app.gui.worker import EngineStatus, PrefillProgress, ReplyProgress

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
    documents = f" ({status.attachment_tokens:,} in documents)" if status.attachment_tokens else ""
    parts = [f"context {status.context_used:,} / {status.context_size:,}{documents}"] if status.context_size else []
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
        if status.finish_reason == "length_closed":
            parts.append("closed at the length limit")
    elif status.context_size:
        parts.append(f"resumed warm ({status.resumed_positions:,} positions)" if status.resumed_positions
                     else "cold start")
    if status.experts_hit_rate is not None:
        parts.append(f"experts streamed from disk: {status.experts_hit_rate:.0%} found in memory")
    elif status.experts_note:
        parts.append(status.experts_note)
    if status.backend:
        parts.append(f"on {status.backend}")
    return SEPARATOR.join(parts)


def seconds_left(progress: PrefillProgress) -> float | None:
    """The time the rest of the prompt takes at the rate read so far; None before the first slice is read."""
    if progress.done <= 0 or progress.elapsed_s <= 0:
        return None
    return (progress.total - progress.done) * progress.elapsed_s / progress.done


def _duration(seconds: float) -> str:
    return f"~{seconds:.0f} s" if seconds < 90 else f"~{seconds / 60:.0f} min"


def describe_kernel_wait(progress: float | None = None, kernel: int = 0) -> str:
    """A reply waiting for kernels: the warm-up's `progress` (0 to 1), else the count of the `kernel` its
    own reading compiles now (how many it needs is not known)."""
    done = f"{progress:.0%}" if progress is not None else f"kernel {kernel:,}"
    return f"preparing this model's kernels for your CPU — first run only, {done}"


def describe_prefill(progress: PrefillProgress) -> str:
    if progress.compiling_kernel:
        reading = [describe_kernel_wait(kernel=progress.compiling_kernel)]
    elif progress.done < progress.total:
        reading = [f"reading prompt {progress.done:,} / {progress.total:,} tokens"]
        left = seconds_left(progress)
        reading += [] if left is None else [f"{_duration(left)} left"]
    else:
        reading = ["writing the reply…"]
    return SEPARATOR.join([*_left_out(progress.left_out_turns), *reading])


def describe_reply(progress: ReplyProgress) -> str:
    written = f"writing the reply: {progress.tokens:,} token{'s' * (progress.tokens != 1)}"
    speed = [] if progress.tokens_per_s is None else [f"{progress.tokens_per_s:.1f} tok/s"]
    return SEPARATOR.join([written, *speed])


class StatusLine(QLabel):
    def __init__(self):
        super().__init__()
        self.setAccessibleName("Reply statistics")
        self.status = EngineStatus()

    def show_status(self, status: EngineStatus) -> None:
        self.status = status
        self.setText(describe(status))
        self.setToolTip(status.experts_outlook)  # what a streamed model's expectation comes from

    def show_prefill(self, progress: PrefillProgress) -> None:
        self.setText(describe_prefill(progress))

    def show_reply(self, progress: ReplyProgress) -> None:
        self.setText(describe_reply(progress))

    def show_kernel_wait(self, progress: float) -> None:
        self.setText(describe_kernel_wait(progress))
