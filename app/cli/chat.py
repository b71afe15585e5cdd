"""`fucina chat [MODEL] [--conversation ID|new]`: a terminal chat that streams replies.

Interactive on a terminal; from a pipe it answers one message per input line until EOF. Replies (and
/stats) go to stdout, notices to stderr, so a piped run's stdout holds only the conversation's answers.
With --conversation the chat is stored (the history database and a KV sidecar, through engine.serving.session)
and a stored one reopens warm; without it, the chat lives only in this process. With --attach FILE the chat
is served behind the documents' KV cartridges (app.cli.attach); a stored chat records its documents and
reopens warm behind them (engine.cartridge.chat_documents), without --attach. With --remote URL the replies
come from an OpenAI-compatible endpoint instead, and the chat is stored (a new one unless --conversation
names one): history, search and export stay local.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
from pathlib import Path
from typing import Iterator

from app.cli.attach import add_attach_option, attach_documents, describe, restore_documents
from app.cli.common import add_model_options, open_model, token_count
from app.cli.sampling import (add_grammar_options, add_sampler_options, grammar_from_args, print_reply_checks,
                              sampler_config)
from app.cli.conversations import find_conversation, open_store
from app.cli.reply_printer import ReplyPrinter
from app.cli.tools import TerminalApproval, add_tool_options, show_tool_ran, toolbox_from_args
from engine.cartridge.build import Attached
from engine.cartridge.chat_documents import cartridges, carry_over, record
from engine.chat import ChatOptions, Conversation, TurnResult
from engine.chat.options import THINK_CHOICES, think_options
from engine.chat.tool_render import tool_format_of
from engine.chat.tool_rounds import ToolRan, send_with_tools
from engine.chat.tool_text import without_call_text
from engine.chat.tool_use import ToolUse
from engine.chat.window import POLICIES
from engine.history.store import HistoryStore
from engine.kv.cache import KvDtype
from engine.model_tokenizer import tokenizer_for
from engine.errors import ContextFull, FucinaError, RemoteConnectionLost, StoreError
from engine.serving.remote import RemoteClient
from engine.serving.remote_session import RemoteChatSession, check_remote_format
from engine.sampling import CHAT_DEFAULTS
from engine.serving.session import DEFAULT_CONTEXT, DEFAULT_MAX_TOKENS, ChatSession

HELP = """commands:
  /reset        forget the conversation (a stored chat: start a new one)
  /system TEXT  set the system prompt (empty to clear) and start over
  /stats        numbers for the last reply
  /quit         leave (so does end of input)"""


class _Chat:
    """What the loop talks to: `target` (a Conversation or a ChatSession) sends and keeps the last turn."""
    target: Conversation | ChatSession

    @property
    def last_turn(self) -> TurnResult | None:
        return self.target.last_turn

    def send(self, text: str) -> Iterator[str]:
        return self.target.send(text)

    def unsaved_reply(self) -> str | None:
        """Why the chat cannot end cleanly: a reply the store refused that one more try did not save."""
        return None

    def last_sidecar_failure(self) -> str | None:
        """After the chat closed: why its last KV sidecar write failed, if it did."""
        return None

    @property
    def left_out_turns(self) -> int:
        """The oldest turns the last reply's prompt left out to fit the context (stored chats only)."""
        return 0


class _EphemeralChat(_Chat):
    """A chat that lives only in this process."""

    def __init__(self, model, args, grammar, attachments, toolbox=None):
        tools = ToolUse(tuple(toolbox.specs()), args.tool_choice) if toolbox is not None else None
        self.convo = self.target = Conversation.for_model(model, ChatOptions(
            system=args.system, capacity=args.ctx, kv_dtype=args.kv, max_tokens=args.max_tokens,
            sampler=sampler_config(args), speculation=args.spec, grammar=grammar,
            thinking_budget=args.thinking_budget, tools=tools, **think_options(args.think)),
            tokenizer=tokenizer_for(model))
        self.toolbox = toolbox
        self.approve = TerminalApproval(args.allow_tools, sys.stdin.isatty())
        if attachments:
            self.convo.attach(attachments)

    def send(self, text: str) -> Iterator[str]:
        if self.toolbox is None:
            return self.convo.send(text)
        return self._rounds(text)

    def _rounds(self, text: str) -> Iterator[str]:
        """The rounds' replies, without their calls' markup: calls and results are shown (stderr) as they run."""
        rounds = send_with_tools(self.convo, text, self.toolbox, approve=self.approve)
        for piece in without_call_text(rounds, tool_format_of(self.convo.template).opener):
            if isinstance(piece, ToolRan):
                show_tool_ran(piece)
            else:
                yield piece

    def reset(self) -> str:
        self.convo.reset()
        return "(conversation reset)"

    def set_system(self, system: str | None) -> str:
        self.convo.system = system
        self.convo.reset()
        return f"(system prompt {'set' if system else 'cleared'}; conversation reset)"


class _StoredChat(_Chat):
    """A chat in the history store, through the session layer: `open_session(conversation_id or None for a
    new one, system prompt, sampler settings, attachments)` opens a ChatSession or a RemoteChatSession.
    `model` is the local model a stored chat's documents are restored for (None: a remote chat, which has
    none)."""

    def __init__(self, open_session, args, store: HistoryStore, grammar, attached: list[Attached], model=None):
        self.open_session, self.store, self.model = open_session, store, model
        self.attached = attached  # a new chat's documents (and the files they were read from: args.attach)
        self.sources = args.attach
        if args.conversation == "new":
            self.settings = {"temperature": args.temp, "top_k": args.top_k, "top_p": args.top_p,
                             "min_p": args.min_p, "repeat_penalty": args.repeat_penalty, "seed": args.seed,
                             "max_tokens": args.max_tokens, "ctx": args.ctx,
                             "context_policy": args.context_policy, "think": args.think,
                             "thinking_budget": args.thinking_budget,
                             "response_format": grammar and grammar.as_setting()}
            self.system = args.system
            self.session = self._new()
        else:
            conversation = find_conversation(store, args.conversation)
            self.session = open_session(conversation, None, None, self._stored_attachments(conversation))
            self.settings, self.system = self.session.settings["sampler"], self.session.settings["system_prompt"]
        resumed = self.session.resumed_positions
        print(f"(conversation {self.session.id[:8]}: {len(self.session.messages())} messages"
              f"{f', resumed {resumed} positions from its sidecar' if resumed else ''})", file=sys.stderr)

    def _stored_attachments(self, conversation: str) -> list:
        """The documents the stored chat is served behind. --attach on it may name the same ones, or (a chat
        with no turn yet) new ones, which replace them; a chat with turns keeps its own."""
        rows = self.store.attachments(conversation)
        if self.attached:
            if [r["document"] for r in rows] != [a.cartridge.document for a in self.attached]:
                if self.store.active_branch(conversation):
                    raise FucinaError(f"conversation {conversation[:8]} already has turns (behind "
                                      f"{', '.join(r['name'] for r in rows) or 'no documents'}); documents attach "
                                      "to a new chat: --conversation new --attach FILE")
                for row in rows:
                    self.store.remove_attachment(row["id"])
                self._record(conversation)
            return [a.cartridge for a in self.attached]
        if self.model is None:
            return []
        restored = restore_documents(self.store, conversation, self.model)
        for r in restored:
            if r.note:
                print(f"warning: {r.note}", file=sys.stderr)
            if r.cartridge is not None:
                print(f"(attached {r.cartridge.name}: {r.cartridge.rows} tokens)", file=sys.stderr)
        return cartridges(restored)

    def _record(self, conversation: str) -> None:
        for source, attached in zip(self.sources, self.attached):
            record(self.store, conversation, source, attached)

    @property
    def target(self) -> ChatSession:
        return self.session

    @property
    def left_out_turns(self) -> int:
        return self.session.last_window.left_out_turns if self.session.last_window else 0

    def _new(self, previous: ChatSession | None = None) -> ChatSession:
        """A new stored chat, behind the documents of `previous` (the one it starts over from), else --attach's."""
        served = previous.attachments if previous and self.model else [a.cartridge for a in self.attached]
        session = self.open_session(None, self.system, {k: v for k, v in self.settings.items() if v is not None},
                                    served)
        if previous:
            carry_over(self.store, previous.id, session.id, served)
        else:
            self._record(session.id)
        return session

    def reset(self) -> str:
        if unsaved := self.unsaved_reply():  # a new conversation would drop the reply kept for this one
            return f"(not reset: {unsaved})"
        self.session.close()
        self.session = self._new(self.session)
        return f"(new conversation {self.session.id[:8]})"

    def set_system(self, system: str | None) -> str:
        """Start over, as /help says: the stored conversation keeps its own prompt and turns, and a new one
        begins on the new prompt (updating the stored prompt in place kept every earlier turn in the next
        reply's context)."""
        if unsaved := self.unsaved_reply():
            return f"(system prompt not changed: {unsaved})"
        self.system = system
        return f"(system prompt {'set' if system else 'cleared'}; {self.reset()[1:]}"

    def unsaved_reply(self) -> str | None:
        try:
            self.session.save_pending()
        except StoreError as e:
            return f"the last reply was not saved (it is shown above): {e}"
        return None

    def last_sidecar_failure(self) -> str | None:
        return self.session.last_sidecar_failure()


def _open_local(args, grammar, stack: contextlib.ExitStack, lines) -> tuple[_Chat, str]:
    model = open_model(args)
    # a stored chat's cache is f16 (its stored settings have no cache type)
    attached = attach_documents(model, args.attach, KvDtype.F16 if args.conversation else args.kv, args.ctx,
                                budget=args.doc_budget, question=lines.first_message)
    for result in attached:
        print(f"(attached {describe(result)})", file=sys.stderr)
    if not args.conversation:
        return (_EphemeralChat(model, args, grammar, [a.cartridge for a in attached], toolbox_from_args(args, stack)),
                Path(model.file.path).name)
    store = stack.enter_context(open_store())

    def open_session(conversation_id, system, sampler, attachments) -> ChatSession:
        return ChatSession.open(store, model, conversation_id, system_prompt=system, sampler=sampler,
                                speculation=args.spec, attachments=attachments)
    return _StoredChat(open_session, args, store, grammar, attached, model), Path(model.file.path).name


def _open_remote(args, grammar, stack: contextlib.ExitStack, lines) -> tuple[_Chat, str]:
    """A stored chat answered by the endpoint: what only a local model does is refused up front."""
    for given, flag in ((args.model, "a MODEL"), (args.attach, "--attach"), (args.spec, "--spec")):
        if given:
            raise FucinaError(f"--remote chats with the endpoint's model: {flag} does not apply (choose the "
                              "endpoint's model with --remote-model NAME)")
    if grammar is not None:
        check_remote_format(grammar.kind)
    client = RemoteClient(args.remote, args.api_key or os.environ.get("FUCINA_API_KEY"), args.remote_model)
    stack.callback(client.close)
    client.choose_model()  # an endpoint that cannot serve is refused before anything is stored
    args.conversation = args.conversation or "new"
    store = stack.enter_context(open_store())

    def open_session(conversation_id, system, sampler, attachments) -> RemoteChatSession:
        return RemoteChatSession.open(store, client, conversation_id, system_prompt=system, sampler=sampler)
    return _StoredChat(open_session, args, store, grammar, []), client.name


class _Input:
    """The chat's input lines; a document served in parts is served by the parts that match the first
    message, which is read ahead for it (and then answered first)."""

    def __init__(self, interactive: bool):
        self._lines = _lines(interactive)
        self._first: list[str] = []

    def first_message(self) -> str:
        self._first.extend(itertools.islice((line for line in self._lines if line.strip()), 1))
        return self._first[0].strip() if self._first else ""

    def __iter__(self) -> Iterator[str]:
        return itertools.chain(self._first, self._lines)


def run_chat(args) -> int:
    grammar = grammar_from_args(args)
    if (args.tools or args.mcp) and (args.conversation or args.remote):
        raise SystemExit("error: --tools and --mcp run an unsaved local chat (without --conversation or --remote)")
    if (args.tools or args.mcp) and grammar is not None:
        raise SystemExit("error: --tools and --mcp take no grammar option: the calls have their own")
    interactive = sys.stdin.isatty()
    lines = _Input(interactive)
    with contextlib.ExitStack() as stack:
        chat, shown_name = (_open_remote if args.remote else _open_local)(args, grammar, stack, lines)
        if isinstance(chat, _StoredChat):
            stack.callback(lambda: chat.session.close())
        if interactive:
            print(f"fucina chat · {shown_name} · /help for commands", file=sys.stderr)
        for line in lines:
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                if not _command(chat, text):
                    break
                continue
            _reply(chat, text)
        unsaved = chat.unsaved_reply()
    if unsaved:
        print(f"error: {unsaved}", file=sys.stderr)
        return 2
    if failure := chat.last_sidecar_failure():  # the last turn's write, which closing the chat waited for
        _warn_sidecar(failure)
    return 0


def _lines(interactive: bool) -> Iterator[str]:
    if not interactive:
        yield from sys.stdin
        return
    while True:
        try:
            yield input("> ")
        except EOFError:
            print(file=sys.stderr)
            return


def _reply(chat, text: str) -> None:
    shown = False
    show = ReplyPrinter()
    try:
        for piece in chat.send(text):
            show(piece)
            shown = True
    except KeyboardInterrupt:  # Ctrl-C stops this reply, not the chat
        show.end_reasoning()
        print(" [stopped]", end="")
    except ContextFull as e:
        print(f"error: {e} (/reset starts over)", file=sys.stderr)
        return
    except StoreError as e:
        if shown:  # the reply was shown but not stored: the session keeps it for the next write
            print(flush=True)
            print(f"error: {e} (the reply above is kept and saved with the next message)", file=sys.stderr)
        else:
            print(f"error: {e} (the message was not sent)", file=sys.stderr)
        return
    except RemoteConnectionLost as e:
        print(flush=True)
        kept = " (the reply so far is kept in the conversation)" if e.partial else ""
        print(f"error: {e}{kept}", file=sys.stderr)
        return
    except FucinaError as e:
        print(f"error: {e}", file=sys.stderr)
        return
    show.end_reasoning()
    print(flush=True)
    if chat.last_turn is not None:
        print_reply_checks(chat.last_turn.finish_reason, chat.last_turn.schema_warnings)
    if chat.target.sidecar_error:
        _warn_sidecar(chat.target.sidecar_error)
    if chat.left_out_turns:
        print(f"(context full: the {chat.left_out_turns} oldest turn{'s' * (chat.left_out_turns > 1)} left out "
              f"of this reply's prompt; they stay stored)", file=sys.stderr)


def _warn_sidecar(failure: str) -> None:
    """A sidecar write that failed costs only warmth (the next open re-prefills), so it is a warning."""
    print(f"warning: {failure}; the conversation is saved, only its KV cache is not (the next turn rewrites "
          "it)", file=sys.stderr)


def _command(chat, text: str) -> bool:
    """Run a slash command; False means leave."""
    name, _, rest = text.partition(" ")
    if name == "/quit":
        return False
    if name == "/reset":
        print(chat.reset(), file=sys.stderr)
    elif name == "/system":
        print(chat.set_system(rest.strip() or None), file=sys.stderr)
    elif name == "/stats":
        print(format_stats(chat.last_turn) if chat.last_turn else "no reply yet", flush=True)
    elif name == "/help":
        print(HELP, file=sys.stderr)
    else:
        print(f"unknown command {name}; /help lists them", file=sys.stderr)
    return True


def format_stats(turn: TurnResult) -> str:
    s = turn.stats
    line = (f"prompt {s.prompt_tokens} tokens ({s.reused_tokens} reused, {s.prefilled_tokens} prefilled in "
            f"{s.prefill_ms:.0f} ms) · first token {s.ttft_ms:.0f} ms · {s.generated_tokens} tokens at "
            f"{s.decode_tps:.1f} tok/s · ended: {turn.finish_reason}")
    return line if s.spec is None else f"{line}\nspeculation: {s.spec.summary()}"


def _reasoning_tokens(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def register(subparsers) -> None:
    p = subparsers.add_parser("chat", help="chat with a model in the terminal (or answer lines from a pipe)")
    add_model_options(p, optional=True)
    p.add_argument("--conversation", metavar="ID|new", default=None,
                   help="store the chat: `new`, or reopen a stored one by id or id prefix (its own settings "
                        "apply; see `fucina conversations list`)")
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--max-tokens", type=token_count, default=DEFAULT_MAX_TOKENS,
                   help=f"longest reply in tokens (default {DEFAULT_MAX_TOKENS}, as in the app)")
    p.add_argument("--ctx", type=token_count, default=DEFAULT_CONTEXT,
                   help=f"context size in tokens (default {DEFAULT_CONTEXT})")
    p.add_argument("--think", choices=THINK_CHOICES, default=None,
                   help="a reasoning model's thinking: on or off (where its template can turn it off), or an "
                        "effort, low, medium or high (gpt-oss); default: the model's own")
    p.add_argument("--no-think", dest="think", action="store_const", const="off", help="the same as --think off")
    p.add_argument("--thinking-budget", type=_reasoning_tokens, metavar="N", default=None,
                   help="close a reasoning model's reasoning after N tokens of it (forces its closing marker)")
    p.add_argument("--context-policy", choices=POLICIES, default=None,
                   help="a new stored chat that outgrows the context: drop_oldest (the default) leaves the "
                        "oldest turns out of the prompt, stop refuses")
    p.add_argument("--spec", action="store_true",
                   help="speculative decoding: drafts from the conversation itself, verified; the same replies")
    add_attach_option(p)
    p.add_argument("--remote", metavar="URL", default=None,
                   help="chat with an OpenAI-compatible endpoint's model (http://HOST:PORT/v1: vLLM, llama-server, "
                        "Ollama, fucina serve); the chat is stored locally")
    p.add_argument("--api-key", default=None, help="the endpoint's API key (default: $FUCINA_API_KEY)")
    p.add_argument("--remote-model", metavar="NAME", default=None,
                   help="the endpoint's model (default: the first it lists)")
    add_sampler_options(p, CHAT_DEFAULTS)
    add_grammar_options(p)
    add_tool_options(p)
    p.set_defaults(func=run_chat)
