"""Which template a model chats with, from its GGUF metadata.

- A `tokenizer.chat_template` in a built-in format renders through that format, as llama.cpp's built-in
  renderer does. With `default_system`, it also adopts the system prompt the model's own template inserts
  into a chat that has none (SmolLM2's and Qwen2.5's do), and then renders byte-identically to the model's
  own template. It is off by default: like llama.cpp (and the golden renders), a chat without a system
  prompt gets none, and SmolLM2-135M answers badly under its own default (greedy, "What is the capital of
  France?": "L'Étoile, la Marseillaise, la femme, ..." with it, "The capital of France is Paris." without).
- A template in no built-in format renders itself, sandboxed (JinjaTemplate).
- No template at all (base models such as Gemma 3 270M): the family's format (Gemma's turn markers are in
  its vocabulary, and llama.cpp renders Gemma this way too), else ChatML, the spec's fallback.
- A built-in format whose GGUF template renders a `tools` variable keeps that template for chats with tools
  (Qwen2.5's: its tool instructions, calls and results as the model was trained on them), compiled at the
  first such chat, so a chat without tools never starts the template renderer for it.
- A template of its own that does not compile, or fails or runs away rendering a one-message chat (a
  broken or hostile GGUF), is treated as no template, with a warning: the model stays usable. One that
  fails only on some later chat fails that turn with its ChatTemplateError; the chat stays as it was.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

from engine.chat.jinja_template import JinjaTemplate
from engine.chat.templates import Format, Message, Template
from engine.errors import ChatTemplateError
from engine.tokenize import Tokenizer

log = logging.getLogger(__name__)

_PROBE = [Message("user", "Hello")]
_SENTINEL = "\x01system\x01"


def template_for_model(metadata: dict, tokenizer: Tokenizer, *,
                       default_system: bool = False) -> Template | JinjaTemplate:
    source = metadata.get("tokenizer.chat_template")
    if source is not None and not isinstance(source, str):  # hostile or broken metadata: not a template
        log.warning("tokenizer.chat_template is %s, not text; using the model family's format instead",
                    type(source).__name__)
        source = None
    builtin = Template.detect(source)
    if builtin is None:
        family = Template(_family_format(str(metadata.get("general.architecture", ""))))
        own = source and _working_own_template(source, tokenizer, family.format)
        return own or family
    if "tools" in source:  # a chat with tools renders through it (engine.chat.tool_render), compiled then
        own_once = functools.cache(lambda: _working_own_template(source, tokenizer, builtin.format))
        builtin = dataclasses.replace(builtin, tools_template=own_once)
    if not default_system:
        return builtin
    own = _working_own_template(source, tokenizer, builtin.format)
    return dataclasses.replace(builtin, default_system=own and own_default_system(builtin, own))


def _working_own_template(source: str, tokenizer: Tokenizer, instead: Format) -> JinjaTemplate | None:
    """The GGUF's own template, or None (with a warning naming `instead`, the format used in its place)
    when it does not compile or cannot render a one-message chat."""
    try:
        own = own_template(source, tokenizer)
        own.render(_PROBE)
    except ChatTemplateError as e:
        log.warning("%s; using the %s format instead", e, instead.value)
        return None
    return own


def stop_token_id(tokenizer: Tokenizer, template: Template | JinjaTemplate) -> int | None:
    """The token that ends a reply: the template's stop marker, else the tokenizer's EOS."""
    marker = template.stop_marker and tokenizer.token_id(template.stop_marker)
    return marker if marker is not None else tokenizer.eos_id


def own_template(source: str, tokenizer: Tokenizer) -> JinjaTemplate:
    """The GGUF's Jinja template with the tokenizer's BOS/EOS texts; a leading BOS text is dropped when
    the tokenizer adds BOS itself."""

    def text(token: int | None) -> str:
        return tokenizer.vocab.tokens[token] if token is not None else ""

    return JinjaTemplate(source, bos_token=text(tokenizer.bos_id), eos_token=text(tokenizer.eos_id),
                         strip_bos=tokenizer.add_bos)


def own_default_system(builtin: Template, own: JinjaTemplate) -> str | None:
    """The system prompt the model's own template inserts into a chat without one, when that is how its
    render of such a chat differs from the built-in format's (None otherwise)."""
    try:
        rendered = own.render(_PROBE)
    except ChatTemplateError:
        return None
    if rendered == builtin.render_messages(_PROBE):
        return None
    head, _, tail = builtin.render_messages([Message("system", _SENTINEL), *_PROBE]).partition(_SENTINEL)
    if rendered.startswith(head) and rendered.endswith(tail) and len(rendered) >= len(head) + len(tail):
        candidate = rendered[len(head): len(rendered) - len(tail)]
        if Template(builtin.format, candidate).render_messages(_PROBE) == rendered:
            return candidate
    return None


def _family_format(arch: str) -> Format:
    if arch.startswith("gemma4"):
        return Format.GEMMA4
    return Format.GEMMA if arch.startswith("gemma") else Format.CHATML
