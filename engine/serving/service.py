"""The engine service (spec 13.8.2's server seams): one compute thread owns a model and serves generation
jobs submitted from any thread. Qt-free; the local server (app/server.py) is an adapter over it.

Jobs queue to the compute thread, which keeps a pool of slots: each is a Conversation (a KV cache and the
tokens behind it) that outlives the requests it serves. A job takes the free slot whose cache shares the
longest token prefix with its prompt, so a client that resends a growing chat prefills only its new part;
when a busy slot holds a longer shared prefix (one system prompt for many clients), its rows are copied
into the free slot instead of being prefilled again. Each job brings its own reply settings (sampler and
seed, stop sequences, grammar, budget, speculation).

Live jobs advance together, so a long reply never holds a short one back: each round takes every plain
reply one token further, their forwards in one weight pass (model.decode_batch, row-wise: each row's bits
are those of a lone step), and every speculative reply one verify step. Jobs beyond the slot count wait in
order. Cancellation is cooperative: `Job.cancel()` ends the reply at its next
token (or prefill slice), or drops it while it waits. A caller with its own conversation (the app's chat,
engine.serving.session) has its reply stream advanced here too, one piece a round (`relay`), so the model only ever
computes on this thread. Every slot keeps its cache in a KV sidecar under the
data dir (engine.kv.persist): a restarted service resumes them, so a resent long conversation is warm.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
import queue
import sys
import threading
import traceback
from pathlib import Path
from typing import Callable, Generator, Iterator, Sequence, TypeVar

import numpy as np

from engine.chat import ChatOptions, Conversation, Message, TurnResult, template_for_model
from engine.chat.conversation import DecodeStep, common_prefix_len
from engine.chat.tool_render import render_with_tools
from engine.chat.tool_use import ToolUse
from engine.embedding import embed
from engine.errors import ContextFull, FucinaError
from engine.kv import persist as kv_persist
from engine.kv.cache import KvDtype
from engine.kv.sidecar_writer import WRITER
from engine.model_tokenizer import tokenizer_for
from engine.models.model import Model
from engine.platform.paths import data_dir
from engine.tools import ToolCall
from engine.sampling import CHAT_DEFAULTS, SamplerConfig
from engine.sampling.grammar import Grammar
from engine.platform.storage_errors import storage_error

DEFAULT_SLOTS = 4
DEFAULT_CONTEXT = 4096
DEFAULT_MAX_WAITING = 64  # jobs queued beyond the slots before new ones are refused (ServiceBusy)
# A busy slot's shared prefix is copied only when it saves at least this many prefill positions.
MIN_COPIED_PREFIX = 32


class ServiceClosed(FucinaError):
    """A job submitted to an engine service that has been closed."""


class ServiceBusy(FucinaError):
    """A job submitted while every slot is busy and the waiting queue is full: try again later."""


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    ids: tuple[int, ...]  # the whole prompt (a full chat render): the slot keeps what it shares
    max_tokens: int
    sampler: SamplerConfig = CHAT_DEFAULTS
    stop: tuple[str, ...] = ()
    grammar: Grammar | None = None
    speculation: bool = True
    split_reasoning: bool = True  # a chat's reply (reasoning apart); off: a completion's raw text
    tools: ToolUse | None = None  # tools the reply may call (the prompt was rendered with them)
    thinking_budget: int | None = None  # reasoning tokens before the reasoning is closed


@dataclasses.dataclass(frozen=True)
class JobResult:
    text: str
    finish_reason: str  # a TurnResult's: stop | stop_sequence | length | length_closed | context | cancelled | error
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the slot's cache already held (not prefilled)
    completion_tokens: int = 0
    ttft_ms: float = 0.0
    decode_tps: float = 0.0
    speculation: dict | None = None  # the speculative decoder's counts, on a speculative reply
    error: BaseException | None = None
    schema_warnings: tuple[str, ...] = ()  # a JSON schema reply's post-checked violations
    reasoning: str = ""  # what the reply reasoned before its answer (`text`)
    tool_calls: tuple[ToolCall, ...] = ()  # the calls the reply made (`text` is what was around them)
    fired_stop: int | None = None  # index into the request's `stop` when one ended the reply

    @classmethod
    def of_turn(cls, turn: TurnResult) -> "JobResult":
        s = turn.stats
        return cls(turn.text, turn.finish_reason, s.prompt_tokens, s.reused_tokens, s.generated_tokens,
                   s.ttft_ms, s.decode_tps, None if s.spec is None else dataclasses.asdict(s.spec), turn.error,
                   turn.schema_warnings, turn.reasoning, turn.tool_calls, turn.fired_stop)


T = TypeVar("T")
Event = str | JobResult  # text pieces (a reasoning piece is a Thought), then one JobResult
Sink = Callable[[Event], None]


class Job:
    """One submitted generation. Its events go to the sink given at submit (called on the compute thread:
    it must not block), or else to a queue that `stream()` reads."""

    def __init__(self, request: GenerationRequest, sink: Sink | None):
        self.request = request
        self.cancel_event = threading.Event()
        self._events: queue.Queue[Event] = queue.Queue()
        self.sink: Sink = sink or self._events.put
        self.result: JobResult | None = None

    def cancel(self) -> None:
        self.cancel_event.set()

    def stream(self) -> Iterator[str]:
        """The reply's text pieces (jobs submitted without a sink); `result` is set when it ends."""
        while True:
            event = self._events.get()
            if isinstance(event, JobResult):
                self.result = event
                return
            yield event

    def wait(self) -> JobResult:
        for _ in self.stream():
            pass
        return self.result


@dataclasses.dataclass(frozen=True)
class _Call:
    """A function to run on the compute thread between two steps, its result going to `future`."""
    fn: Callable[[], object]
    future: concurrent.futures.Future

    def run(self) -> None:
        if self.future.set_running_or_notify_cancel():
            try:
                self.future.set_result(self.fn())
            except Exception as e:
                self.future.set_exception(e)


class _Relay:
    """An iterator of another thread's (a chat session's reply stream: engine.serving.session) advanced here, one
    item per round between the slots' steps, so that its model work runs on the compute thread; the items
    go back through a queue to the thread that reads `items()`."""

    def __init__(self, iterator: Iterator):
        self.iterator = iterator
        self.closing = threading.Event()  # the reader stopped reading: close the iterator here
        self._items: queue.Queue = queue.Queue()
        self.done = False

    def step(self, failure: BaseException | None = None) -> None:
        """One item (on the compute thread); the end, an exception or a close request end the relay (with
        `failure`, the compute thread's, when it stops for one)."""
        try:
            if self.closing.is_set():
                self.iterator.close()
                self._end(_RelayEnd(failure))
            else:
                self._items.put(next(self.iterator))
        except StopIteration:
            self._end(_RelayEnd())
        except BaseException as e:  # the reader raises it: the stream's own error, told where it was read
            self._end(_RelayEnd(e))

    def _end(self, end: "_RelayEnd") -> None:
        self.done = True
        self._items.put(end)

    def items(self) -> Iterator:
        """The iterator's items, read on any thread; closing this early closes the iterator (at the compute
        thread's next round) and returns once it is closed."""
        try:
            while True:
                item = self._items.get()
                if isinstance(item, _RelayEnd):
                    if item.error is not None:
                        raise item.error
                    return
                yield item
        finally:
            if not self.done or not self._items.empty():
                self.closing.set()
                while not isinstance(self._items.get(), _RelayEnd):
                    pass


@dataclasses.dataclass(frozen=True)
class _RelayEnd:
    error: BaseException | None = None


@dataclasses.dataclass
class _Slot:
    index: int
    convo: Conversation
    job: Job | None = None
    stream: Generator[str | DecodeStep, np.ndarray | None, None] | None = None
    logits: np.ndarray | None = None  # the batched forward's row for the step the stream waits on
    before: TurnResult | None = None  # the conversation's last turn before this job's
    last_used: int = 0


class EngineService:
    """A model served to many requests by one compute thread. `close()` stops it and waits for its sidecar
    writes. With `open_slots_at_first_job` the slot pool (its caches and sidecars) is made when the first
    job comes, not before: a service that may only relay (the app's, until its local server is used)
    writes nothing to the data dir."""

    def __init__(self, model: Model, *, slots: int = DEFAULT_SLOTS, capacity: int = DEFAULT_CONTEXT,
                 kv_dtype: KvDtype | str = KvDtype.F16, sidecar_dir: str | os.PathLike | None = None,
                 max_waiting: int = DEFAULT_MAX_WAITING, open_slots_at_first_job: bool = False):
        if slots < 1:
            raise ValueError(f"an engine service needs at least one slot, got {slots}")
        self.model, self.capacity, self.kv_dtype = model, capacity, kv_dtype
        self.tokenizer = tokenizer_for(model)  # the one the model's chat sessions use
        self.template = template_for_model(model.file.metadata, self.tokenizer)
        self._render_lock = threading.Lock()  # a model's own template renders in a child process, one at a time
        self._jobs: queue.Queue[Job | _Call | None] = queue.Queue()
        self._closed = False
        self._counts = collections.Counter()
        # jobs submitted and not ended, bounded so that a flood of requests queues no unbounded work
        self._max_waiting = max_waiting
        self._unfinished = threading.BoundedSemaphore(slots + max_waiting)
        self._clock = 0
        self._relays: list[_Relay] = []  # streams relayed for other threads, advanced with the slots
        self._slot_count, self._sidecar_dir = slots, Path(sidecar_dir or data_dir() / "server-slots")
        self._slots: list[_Slot] = []
        if not open_slots_at_first_job:
            self._open_slots()
        self.resumed_positions = [s.convo.cache.len for s in self._slots]
        self._thread = threading.Thread(target=self._run, name="fucina-engine", daemon=True)
        self._thread.start()

    def _open_slots(self) -> None:
        """The slot pool, each cache resumed from its sidecar (a full or read-only data dir: StoreError)."""
        try:
            self._sidecar_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise storage_error(e, self._sidecar_dir) from e
        # slots of one model share sidecar names (so a restart finds them); another model's are left alone
        stem = kv_persist.model_fingerprint(self.model.file).hex()[:16]
        self._slots = [self._open_slot(i, self._sidecar_dir / f"{stem}-{i}.fkv") for i in range(self._slot_count)]

    def _open_slot(self, index: int, sidecar: Path) -> _Slot:
        convo = Conversation.for_model(self.model, ChatOptions(capacity=self.capacity, kv_dtype=self.kv_dtype),
                                       tokenizer=self.tokenizer)
        try:
            convo.enable_persistence(sidecar)
        except OSError as e:
            raise storage_error(e, sidecar) from e
        return _Slot(index, convo)

    # -- prompts (any thread) ---------------------------------------------------------------------------

    def chat_prompt(self, messages: Sequence[Message], *, reasoning_effort: str | None = None,
                    tools: ToolUse | None = None, think_off: bool = False) -> list[int]:
        """A chat rendered with the model's template, ready to answer, as ids; with the tools offered where
        `tools` is active, and with its tool calls and results where it holds any (engine.chat.tool_render)."""
        offered = tools.tools if tools is not None and tools.active else ()
        with self._render_lock:
            if offered or any(m.role == "tool" or m.tool_calls for m in messages):
                text = render_with_tools(self.template, list(messages), offered, think_off=think_off,
                                         reasoning_effort=reasoning_effort)
            else:
                text = self.template.render_messages(list(messages), think_off=think_off,
                                                     reasoning_effort=reasoning_effort)
            return self.tokenizer.encode(text, add_special=True)

    def text_prompt(self, text: str) -> list[int]:
        """Raw text to continue, as ids (with the model's BOS where it takes one)."""
        with self._render_lock:
            return self.tokenizer.encode(text, add_special=True)

    # -- jobs (any thread) ------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest, sink: Sink | None = None) -> Job:
        """Queue a generation. A prompt the context cannot hold is refused here (ContextFull)."""
        if self._closed:
            raise ServiceClosed("the engine service is closed")
        if not request.ids:
            raise ValueError("the prompt is empty")
        if len(request.ids) >= self.capacity:
            raise ContextFull(f"the prompt has {len(request.ids)} tokens but the context holds {self.capacity} "
                              "(with room for at least one reply token); shorten it or serve a larger context")
        if not self._unfinished.acquire(blocking=False):
            raise ServiceBusy(f"all {self._slot_count} slots are busy and {self._max_waiting} requests wait "
                              "already; try again shortly")
        job = Job(request, sink)
        self._jobs.put(job)
        return job

    def embed(self, ids: Sequence[int]) -> concurrent.futures.Future:
        """An embedding of the prompt `ids`: the mean of its final hidden states, L2-normalised (float32
        [n_embd]), computed on the compute thread between two steps of the live jobs; a Future of it."""
        if self._closed:
            raise ServiceClosed("the engine service is closed")
        if not ids:
            raise ValueError("the text to embed is empty")
        if len(ids) > self.capacity:
            raise ContextFull(f"the text to embed has {len(ids)} tokens but the context holds {self.capacity}")

        call = _Call(lambda: embed(self.model, ids, self.kv_dtype), concurrent.futures.Future())
        self._jobs.put(call)
        return call.future

    def relay(self, iterator: Iterator[T]) -> Iterator[T]:
        """`iterator`'s items, computed on the compute thread one per round, between the slots' steps: the
        model work of a caller's own stream (the app's chat session) shares the thread with the jobs. It
        starts when first read; closing it early closes `iterator` there, and its exception is raised here."""
        relay = _Relay(iterator)

        def items() -> Iterator[T]:
            if self._closed:
                raise ServiceClosed("the engine service is closed")
            self._jobs.put(relay)
            yield from relay.items()
        return items()

    def status(self) -> dict:
        """Counts of jobs by how they ended, and the live and waiting ones (a snapshot)."""
        counts = dict(self._counts)
        return {"slots": self._slot_count, "context": self.capacity,
                "live": sum(s.job is not None for s in self._slots),
                "waiting": self._jobs.qsize(), "finished": counts}

    def close(self) -> None:
        """Cancel every job, stop the compute thread and wait for the slots' sidecar writes."""
        if not self._closed:
            self._closed = True
            self._jobs.put(None)
            self._thread.join()
        WRITER.flush()

    # -- the compute thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        waiting: collections.deque[Job] = collections.deque()
        try:
            self._serve(waiting)
        except BaseException as e:  # a bug here must not leave clients waiting on jobs nobody runs
            traceback.print_exc(file=sys.stderr)
            self._closed = True
            self._stop(waiting, [], failure=e)

    def _serve(self, waiting: collections.deque[Job]) -> None:
        while True:
            live = [s for s in self._slots if s.job is not None]
            try:
                while True:  # take what was submitted; wait for it only when there is nothing to do
                    job = self._jobs.get(block=not live and not waiting and not self._relays)
                    if job is None:
                        return self._stop(waiting, live)
                    if isinstance(job, _Call):
                        job.run()
                    elif isinstance(job, _Relay):
                        self._relays.append(job)
                    else:
                        waiting.append(job)
            except queue.Empty:
                pass
            for job in [j for j in waiting if j.cancel_event.is_set()]:
                waiting.remove(job)
                self._end(job, JobResult("", "cancelled"))
            if waiting and not self._slots:
                try:
                    self._open_slots()
                except FucinaError as e:  # the jobs cannot be served; the relays go on
                    while waiting:
                        self._end(waiting.popleft(), JobResult("", "error", error=e))
            while waiting and any(s.job is None for s in self._slots):
                self._start(waiting.popleft())
            self._round()

    def _round(self) -> None:
        """Every live job to its next token (one speculative step), the plain ones' forwards in one batch;
        every relayed stream to its next piece."""
        for relay in list(self._relays):
            relay.step()
            if relay.done:
                self._relays.remove(relay)
        steps = [(slot, step) for slot in self._slots if (step := self._advance(slot)) is not None]
        if not steps:
            return
        try:
            rows = self.model.decode_batch([step.token for _, step in steps], [step.cache for _, step in steps])
        except Exception as e:  # shared compute: every job in the batch fails with it
            for slot, _ in steps:
                try:
                    slot.stream.throw(e)
                except Exception:
                    pass
                self._fail(slot, e)
            return
        for (slot, _), row in zip(steps, rows):
            slot.logits = row

    def _stop(self, waiting: Sequence[Job], live: Sequence[_Slot], failure: BaseException | None = None) -> None:
        """End every job: live ones are cancelled (and run to their end), waiting ones dropped; after a
        `failure` of the compute thread, every job fails with it."""
        for relay in self._relays:  # a caller's stream ends; its reader sees the end (or the failure)
            relay.closing.set()
            relay.step(failure)
        self._relays.clear()
        for slot in live:
            slot.job.cancel()
        while any(slot.job is not None for slot in live):
            self._round()
        dropped = list(waiting) + [s.job for s in self._slots if s.job is not None and failure is not None]
        for job in dropped:
            self._end(job, JobResult("", "error", error=failure) if failure else JobResult("", "cancelled"))
        while failure is not None and not self._jobs.empty():
            job = self._jobs.get()
            if isinstance(job, Job):
                self._end(job, JobResult("", "error", error=failure))
            elif isinstance(job, _Relay):
                job.closing.set()
                job.step(failure)

    def _start(self, job: Job) -> None:
        """Give the job a slot and start its reply (a start that fails ends the job, not the service)."""
        ids = list(job.request.ids)
        r = job.request
        try:
            slot = self._pick_slot(ids)
            self._clock += 1
            slot.job, slot.last_used, slot.before = job, self._clock, slot.convo.last_turn
            slot.convo.reconfigure(ChatOptions(capacity=self.capacity, kv_dtype=self.kv_dtype,
                                               max_tokens=r.max_tokens, sampler=r.sampler, stop_sequences=r.stop,
                                               grammar=r.grammar, speculation=r.speculation,
                                               split_reasoning=r.split_reasoning, tools=r.tools,
                                               thinking_budget=r.thinking_budget))
            slot.stream = slot.convo.send_tokens(ids, job.cancel_event, reuse=True, batched=True)
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            for slot in self._slots:
                if slot.job is job:
                    slot.job = slot.stream = None
            self._end(job, JobResult("", "error", error=e))

    def _pick_slot(self, ids: list[int]) -> _Slot:
        """The free slot whose cache `ids` continue (they share at least half of what it holds: a resent
        chat), else the least recently used one, which a chat template's common opening does not claim;
        a longer prefix held by a busy slot is copied into it."""
        shared = {s.index: common_prefix_len(ids, s.convo.history) for s in self._slots}
        free = [s for s in self._slots if s.job is None]
        best = max(free, key=lambda s: shared[s.index])
        continued = shared[best.index] and 2 * shared[best.index] >= len(best.convo.history)
        slot = best if continued else min(free, key=lambda s: s.last_used)
        donor = max(self._slots, key=lambda s: shared[s.index])
        if shared[donor.index] - shared[slot.index] >= MIN_COPIED_PREFIX:
            slot.convo.copy_prefix(donor.convo, min(shared[donor.index], donor.convo.cache.len))
        return slot

    def _advance(self, slot: _Slot) -> DecodeStep | None:
        """Run the slot's job to its next token's forward (the DecodeStep it waits on, for the batch), to the
        end of one speculative step, or to its end; its text pieces go to the job's sink on the way."""
        while slot.job is not None:
            logits, slot.logits = slot.logits, None
            try:
                event = next(slot.stream) if logits is None else slot.stream.send(logits)
            except StopIteration:
                turn = slot.convo.last_turn
                self._end_slot(slot, JobResult.of_turn(turn) if turn is not slot.before else JobResult("", "cancelled"))
                return None
            except Exception as e:  # a failing turn (its error is recorded) or a refused prompt
                if not isinstance(e, FucinaError):
                    traceback.print_exc(file=sys.stderr)
                self._fail(slot, e)
                return None
            if isinstance(event, DecodeStep):
                return event
            self._deliver(slot.job, event)
            if slot.job.request.speculation:  # a speculative turn forwards itself, one verify per step
                return None
        return None

    def _fail(self, slot: _Slot, error: BaseException) -> None:
        turn = slot.convo.last_turn
        result = JobResult.of_turn(turn) if turn is not slot.before else JobResult("", "error")
        self._end_slot(slot, dataclasses.replace(result, finish_reason="error", error=error))

    def _end_slot(self, slot: _Slot, result: JobResult) -> None:
        job, slot.job, slot.stream, slot.logits = slot.job, None, None, None
        self._end(job, result)

    def _end(self, job: Job, result: JobResult) -> None:
        job.result = result
        self._counts[result.finish_reason] += 1
        self._unfinished.release()
        self._deliver(job, result)

    @staticmethod
    def _deliver(job: Job, event: Event) -> None:
        try:
            job.sink(event)
        except Exception:  # the consumer is gone (a closed event loop): its reply stops
            job.cancel()
