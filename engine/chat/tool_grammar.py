"""The grammar of one tool call, from its opener on: a choice over the tools' names, each with its arguments
held to the tool's JSON schema (llguidance's `%json`), then the format's closer.

The text before the opener is the model's own (engine.chat.tool_constraint decides where a call starts);
this grammar takes over once the opener is written, so every call that starts is a valid one. JSON is
written on one line with the separators Python's json.dumps uses (as reply grammars do,
engine.sampling.grammar.JSON_OPTIONS), so its keys and punctuation are forced spans speculation drafts.
"""

from __future__ import annotations

import json
from typing import Sequence

from engine.chat.tool_format import HARMONY, HERMES, LLAMA3, MISTRAL, ToolFormat
from engine.sampling import json_schema
from engine.sampling.grammar import JSON_OPTIONS, Grammar
from engine.tokenize import Tokenizer
from engine.tokenize.vocab import NORMAL
from engine.tools import ToolSpec


def call_grammar(fmt: ToolFormat, tools: Sequence[ToolSpec], tokenizer: Tokenizer) -> Grammar:
    """A Lark grammar for what follows `fmt`'s opener: one call (Mistral: a list of them) to one of `tools`."""
    if not tools:
        raise ValueError("a call grammar needs at least one tool")
    rules = [f"args{i}: %json {_schema(tool)}" for i, tool in enumerate(tools)]
    marker = _Markers(tokenizer)
    if fmt is HERMES:
        calls = [f'"\\n" {_lit(_object_head(t.name, "arguments"))} args{i} "}}\\n" {marker(fmt.closer)}'
                 for i, t in enumerate(tools)]
        start = "start: call\ncall: " + "\n    | ".join(calls)
    elif fmt is LLAMA3:  # the opener is `{"name": "`
        calls = [f'{_lit(json.dumps(t.name, ensure_ascii=False)[1:] + ", " + json.dumps("parameters") + ": ")} '
                 f'args{i} "}}"' for i, t in enumerate(tools)]
        start = "start: call\ncall: " + "\n    | ".join(calls)
    elif fmt is MISTRAL:
        calls = [f'{_lit(_object_head(t.name, "arguments"))} args{i} "}}"' for i, t in enumerate(tools)]
        start = 'start: "[" call (", " call)* "]"\ncall: ' + "\n    | ".join(calls)
    elif fmt is HARMONY:  # the opener is `to=functions.`; <|call|> is the stop that follows the grammar
        calls = [f'{_lit(t.name + " ")} {marker("<|constrain|>")} "json" {marker("<|message|>")} args{i}'
                 for i, t in enumerate(tools)]
        start = "start: call\ncall: " + "\n    | ".join(calls)
    else:
        raise ValueError(f"no call grammar for the {fmt.name} format")
    return Grammar("lark", "\n".join([start, *rules]) + "\n")


def _object_head(name: str, arguments_key: str) -> str:
    """`{"name": "NAME", "ARGUMENTS_KEY": ` as json.dumps writes it."""
    return json.dumps({"name": name, arguments_key: 0}, ensure_ascii=False)[:-2]


def _schema(tool: ToolSpec) -> str:
    """The tool's parameters as `%json` takes them: rewritten as reply schemas are, written on one line."""
    schema = json_schema.rewrite(tool.parameters if isinstance(tool.parameters, dict) else {})
    schema.setdefault("type", "object")
    schema["x-guidance"] = {**JSON_OPTIONS, "lenient": True, **schema.get("x-guidance", {})}
    return json.dumps(schema, ensure_ascii=False)


def _lit(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


class _Markers:
    """A marker as the grammar must spell it: the special token it is where the vocabulary has one (a
    grammar's text never becomes a control token), else its text."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> str:
        token = self.tokenizer.token_id(text)
        if token is not None and self.tokenizer.vocab.types[token] != NORMAL:
            return f"<[{token}]>"
        return _lit(text)
