"""A turn that may call tools: the model replies, its calls run (once approved), their results go back, and
the model replies again, until a reply makes no call or the rounds run out.

Every round is a turn of the conversation, so its reply, its calls and the tool messages are in
`convo.messages` (and its cache) as they happened. A tool's own failure is a result the model reads, never
an exception (engine.tools.Toolbox); a call the user declines gets an error result saying so.

A stop (`cancel`) between calls still ends the round whole: the calls it came before get a result saying so
(ToolResult.stopped) and every result goes back (a stored chat writes them to its history), to a reply the
stop ends at its start. So a stopped round keeps every call's outcome, as a stopped reply keeps its text.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Callable, Iterator

from engine.chat.conversation import Conversation
from engine.chat.templates import Message
from engine.tools import ToolCall, ToolResult, Toolbox

MAX_ROUNDS = 8  # replies in one turn; the last one's calls (if any) are left unanswered
DECLINED = "The user declined to run this tool call."


@dataclass(frozen=True)
class ToolRan:
    """A call that ran (or was declined), between two rounds' replies."""
    call: ToolCall
    result: ToolResult

    @property
    def message(self) -> Message:
        """The tool message that gives the model the result."""
        return Message.tool_result(self.call, self.result)


def send_with_tools(convo: Conversation, user: str, toolbox: Toolbox, *,
                    approve: Callable[[ToolCall], bool] | None = None, cancel: threading.Event | None = None,
                    max_rounds: int = MAX_ROUNDS) -> Iterator[str | ToolRan]:
    """Stream every round's reply pieces, and a ToolRan for each call between rounds. The conversation's
    options say which tools are offered (ChatOptions.tools); a tool_choice that forces a call holds the
    first round only, so the rounds can end."""
    return run_tool_rounds(convo, convo.send(user, cancel),
                           lambda ran: convo.send_tool_results([r.message for r in ran], cancel), toolbox,
                           approve=approve, cancel=cancel, max_rounds=max_rounds)


def run_tool_rounds(convo: Conversation, first: Iterator[str],
                    answer: Callable[[list[ToolRan]], Iterator[str]], toolbox: Toolbox, *,
                    approve: Callable[[ToolCall], bool] | None = None, cancel: threading.Event | None = None,
                    max_rounds: int = MAX_ROUNDS) -> Iterator[str | ToolRan]:
    """The rounds of send_with_tools over any way to start them: `first` streams the first reply and
    `answer(the calls that ran)` the reply after a round's calls (a stored chat writes each to its history as it
    goes); both reply in `convo`, whose last turn holds the calls."""
    initial = convo.options
    stream = first
    try:
        for round_ in range(max_rounds):
            yield from stream
            turn = convo.last_turn
            if not turn.tool_calls or turn.finish_reason not in ("stop", "length_closed") or round_ + 1 == max_rounds:
                return
            ran = []
            for call in turn.tool_calls:
                if cancel is not None and cancel.is_set():  # answered all the same: the chat keeps every call
                    result = ToolResult.stopped(call.id)
                elif approve is None or approve(call):
                    result = toolbox.run(call)
                else:
                    result = ToolResult(call.id, DECLINED, is_error=True)
                ran.append(ToolRan(call, result))
                yield ran[-1]
            if initial.tools is not None and initial.tools.must_call and convo.options is initial:
                convo.reconfigure(dataclasses.replace(initial, tools=dataclasses.replace(initial.tools, choice="auto")))
            stream = answer(ran)
    finally:
        if convo.options is not initial:
            convo.reconfigure(initial)
