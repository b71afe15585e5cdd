"""Checks on what the history store is asked to keep, made before anything is written.

One validator for sampler settings, whether they come from the app's settings dialog, the CLI's flags or an
imported file, one for a conversation's own tool setting, and one for a whole imported document. Errors are
HistoryErrors naming the JSON path of the offending field: "conversation.sampler.ctx: expected an integer between
16 and 131072, got 'abc'".
"""

from __future__ import annotations

import json
import math
import re
import os
from pathlib import Path

from engine.chat.options import THINK_CHOICES
from engine.context_policy import POLICIES
from engine.errors import HistoryError, InvalidGrammar
from engine.sampling.grammar import Grammar

ROLES = ("system", "user", "assistant", "tool")
EXPORT_FORMAT = "fucina-conversation"
EXPORT_VERSION = 2  # 2 added tool calls and tool messages; a version 1 file (which has none) still imports

# key -> (type, lowest, highest). A context beyond 131072 positions is a typo, not a chat: its KV cache
# would be allocated up front (10**12 positions is hundreds of TiB).
SAMPLER_RANGES: dict[str, tuple[type, float, float]] = {
    "temperature": (float, 0.0, 10.0),
    "top_k": (int, 0, 1_000_000),
    "top_p": (float, 0.0, 1.0),
    "min_p": (float, 0.0, 1.0),
    "repeat_penalty": (float, 0.01, 10.0),
    "seed": (int, 0, 2**63 - 1),
    "max_tokens": (int, 1, 131_072),
    "ctx": (int, 16, 131_072),
    "thinking_budget": (int, 0, 131_072),  # reasoning tokens before the reasoning is closed
}
# key -> the values it may take
SAMPLER_CHOICES: dict[str, tuple[str, ...]] = {"context_policy": POLICIES, "think": THINK_CHOICES}
# response_format: {"type": "free" | a grammar kind, "grammar": TEXT} (Grammar.as_setting), compiled to check it
SAMPLER_KEYS = (*SAMPLER_RANGES, *SAMPLER_CHOICES, "response_format")

MAX_IMPORT_BYTES = 256 * 1024 * 1024
MAX_MESSAGES = 100_000
MAX_META_DEPTH = 16  # a message's meta holds flat figures; deeper nesting is not an export of ours


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def check_sampler(sampler, where: str = "sampler") -> dict:
    """`sampler` checked key by key (None: not set) and returned as a new dict; a whole-number float for an
    integer key becomes an int. `where` prefixes the path in the error."""
    if sampler is None:
        return {}
    if not isinstance(sampler, dict):
        raise HistoryError(f"{where}: expected an object of {', '.join(SAMPLER_KEYS)}, got {_shown(sampler)}")
    unknown = sorted(str(k) for k in sampler if k not in SAMPLER_KEYS)
    if unknown:
        raise HistoryError(f"{where}: unknown sampler setting(s) {', '.join(unknown)}; known: "
                           f"{', '.join(SAMPLER_KEYS)}")
    checked = {}
    for key, value in sampler.items():
        if value is None:
            pass
        elif key == "response_format":
            try:
                Grammar.from_setting(value)
            except InvalidGrammar as e:
                raise HistoryError(f"{where}.{key}: {e}") from None
        elif key in SAMPLER_CHOICES:
            if value not in SAMPLER_CHOICES[key]:
                raise HistoryError(f"{where}.{key}: expected one of {', '.join(SAMPLER_CHOICES[key])}, "
                                   f"got {_shown(value)}")
        else:
            value = _number(value, *SAMPLER_RANGES[key], f"{where}.{key}")
        checked[key] = value
    return checked


def check_tools(tools, where: str = "tools") -> dict | None:
    """A conversation's own tool setting, {"enabled": [tool names], "choice": "auto" | "required" | "none" | a
    tool's name}, checked and returned with its names sorted once each (None: the app's defaults)."""
    if tools is None:
        return None
    if not isinstance(tools, dict) or set(tools) != {"enabled", "choice"}:
        raise HistoryError(f"{where}: expected an object of enabled, choice, got {_shown(tools)}")
    enabled = tools["enabled"]
    if not isinstance(enabled, list):
        raise HistoryError(f"{where}.enabled: expected a list of tool names, got {_shown(enabled)}")
    names = [check_text(name, f"{where}.enabled[{i}]") for i, name in enumerate(enabled)]
    choice = check_text(tools["choice"], f"{where}.choice")
    if not choice:
        raise HistoryError(f"{where}.choice: expected auto, required, none or a tool's name, got ''")
    return {"enabled": sorted(set(names)), "choice": choice}


def _number(value, kind: type, low: float, high: float, where: str):
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int and is_number and isinstance(value, float) and value.is_integer():
        value = int(value)
    ok = is_number and (kind is float or isinstance(value, int)) and math.isfinite(value) and low <= value <= high
    if not ok:
        noun = "an integer" if kind is int else "a number"
        raise HistoryError(f"{where}: expected {noun} between {low:g} and {high:g}, got {_shown(value)}")
    return float(value) if kind is float else value


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(value, where: str, *, optional: bool = False) -> str | None:
    """A string SQLite can store as UTF-8 (no lone surrogate, which JSON's \\ud800 escapes allow)."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise HistoryError(f"{where}: expected a string{' or null' if optional else ''}, got {_shown(value)}")
    surrogate = _SURROGATE.search(value)  # a search, not an encode: a huge message is not copied
    if surrogate:
        raise HistoryError(f"{where}: contains a lone surrogate {surrogate.group()!r} at character "
                           f"{surrogate.start()}, which is not text")
    return value


def _check_json_value(value, where: str, depth: int = 0) -> None:
    if depth > MAX_META_DEPTH:
        raise HistoryError(f"{where}: nested deeper than {MAX_META_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in value.items():
            check_text(key, f"{where} key")
            _check_json_value(item, f"{where}.{key}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_json_value(item, f"{where}[{i}]", depth + 1)
    elif isinstance(value, str):
        check_text(value, where)
    elif isinstance(value, float) and not math.isfinite(value):
        raise HistoryError(f"{where}: {value} is not a number JSON can hold")
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise HistoryError(f"{where}: {_shown(value)} is not a JSON value")


def _field(obj: dict, key: str, where: str, kind: type, *, required: bool = False):
    value = obj.get(key)
    if value is None and not required:
        return None
    if kind is str:
        return check_text(value, f"{where}.{key}")
    if not isinstance(value, kind):
        raise HistoryError(f"{where}.{key}: expected {'true or false' if kind is bool else kind.__name__}, "
                           f"got {_shown(value)}")
    return value


def check_tool_calls(calls, where: str) -> list[dict]:
    """A reply's tool calls (None: none) as a list of {id, name, arguments}, arguments a JSON object."""
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise HistoryError(f"{where}: expected a list of {{id, name, arguments}}, got {_shown(calls)}")
    checked = []
    for i, call in enumerate(calls):
        at = f"{where}[{i}]"
        if not isinstance(call, dict):
            raise HistoryError(f"{at}: expected an object of id, name, arguments, got {_shown(call)}")
        arguments = call.get("arguments")
        if not isinstance(arguments, dict):
            raise HistoryError(f"{at}.arguments: expected an object, got {_shown(arguments)}")
        _check_json_value(arguments, f"{at}.arguments")
        checked.append({"id": _field(call, "id", at, str, required=True),
                        "name": _field(call, "name", at, str, required=True), "arguments": arguments})
    return checked


def check_tool_result(result, where: str) -> dict:
    """A tool message's {call_id, name, is_error, seconds}: the call it answers, the tool, and how it went."""
    if not isinstance(result, dict):
        raise HistoryError(f"{where}: expected an object of call_id, name, is_error, seconds, got {_shown(result)}")
    seconds = result.get("seconds")
    return {"call_id": _field(result, "call_id", where, str, required=True),
            "name": _field(result, "name", where, str, required=True),
            "is_error": bool(_field(result, "is_error", where, bool)),
            "seconds": None if seconds is None else _number(seconds, float, 0.0, 1e9, f"{where}.seconds")}


def check_tool_parts(role: str, tool_calls, tool_result, where: str) -> tuple[list[dict], dict | None]:
    """A message's tool parts checked against its role: calls only on a reply, and a tool message (and only
    it) with the result's details."""
    calls = check_tool_calls(tool_calls, f"{where}.tool_calls")
    if calls and role != "assistant":
        raise HistoryError(f"{where}.tool_calls: only an assistant message makes tool calls, not a {role} one")
    if role != "tool":
        if tool_result is not None:
            raise HistoryError(f"{where}.tool_result: only a tool message carries one, not a {role} one")
        return calls, None
    return calls, check_tool_result(tool_result, f"{where}.tool_result")


def check_export(data) -> tuple[dict, list[dict]]:
    """The conversation and its messages of an export_json document, every field checked (types, ranges,
    ids unique and referenced ones present), normalised: absent optional fields are None."""
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise HistoryError(f"format: not a {EXPORT_FORMAT!r} export (missing or wrong 'format')")
    version = data.get("version")
    if type(version) is not int or not 1 <= version <= EXPORT_VERSION:
        raise HistoryError(f"version: unsupported export version {_shown(version)} (this build reads versions 1 "
                           f"to {EXPORT_VERSION})")
    conv, messages = data.get("conversation"), data.get("messages")
    if not isinstance(conv, dict):
        raise HistoryError(f"conversation: expected an object, got {_shown(conv)}")
    if not isinstance(messages, list):
        raise HistoryError(f"messages: expected a list, got {_shown(messages)}")
    if len(messages) > MAX_MESSAGES:
        raise HistoryError(f"messages: {len(messages)} messages, more than the {MAX_MESSAGES} an import takes")
    checked_conv = {
        "model": _field(conv, "model", "conversation", str, required=True),
        "title": _field(conv, "title", "conversation", str),
        "system_prompt": _field(conv, "system_prompt", "conversation", str),
        "sampler": check_sampler(conv.get("sampler"), "conversation.sampler"),
        "tools": check_tools(conv.get("tools"), "conversation.tools"),
        "pinned": bool(_field(conv, "pinned", "conversation", bool)),
        "created_at": _field(conv, "created_at", "conversation", str),
        "active_leaf": _field(conv, "active_leaf", "conversation", str),
    }
    checked, ids = [], set()
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise HistoryError(f"{where}: expected an object, got {_shown(m)}")
        mid = _field(m, "id", where, str, required=True)
        if mid in ids:
            raise HistoryError(f"{where}.id: {mid!r} is not unique")
        ids.add(mid)
        if m.get("role") not in ROLES:
            raise HistoryError(f"{where}.role: expected one of {', '.join(ROLES)}, got {_shown(m.get('role'))}")
        meta = m.get("meta")
        if meta is not None and not isinstance(meta, dict):
            raise HistoryError(f"{where}.meta: expected an object, got {_shown(meta)}")
        _check_json_value(meta, f"{where}.meta")
        tool_calls, tool_result = check_tool_parts(m["role"], m.get("tool_calls"), m.get("tool_result"), where)
        checked.append({"id": mid, "parent_id": _field(m, "parent_id", where, str), "role": m["role"],
                        "content": _field(m, "content", where, str, required=True),
                        "reasoning": _field(m, "reasoning", where, str),
                        "created_at": _field(m, "created_at", where, str), "meta": meta or {},
                        "tool_calls": tool_calls, "tool_result": tool_result})
    for i, m in enumerate(checked):
        if m["parent_id"] is not None and m["parent_id"] not in ids:
            raise HistoryError(f"messages[{i}].parent_id: {m['parent_id']!r} is not in the export")
    leaf = checked_conv["active_leaf"]
    if leaf is not None and leaf not in ids:
        raise HistoryError(f"conversation.active_leaf: {leaf!r} is not one of the exported messages")
    return checked_conv, checked


def read_export(path: str | os.PathLike) -> dict:
    """An export file parsed as JSON, refusing one too large to be an export or nested too deeply to parse."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_IMPORT_BYTES:
            raise HistoryError(f"cannot import {path}: {size:,} bytes, more than the "
                               f"{MAX_IMPORT_BYTES // 2**20} MiB an export can be")
        return json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise HistoryError(f"cannot import {path}: its JSON is nested too deeply") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:  # ValueError: not JSON, or an absurdly long number
        raise HistoryError(f"cannot import {path}: {e}") from None
