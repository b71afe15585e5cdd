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
"""

from __future__ import annotations

from engine.chat.jinja_template import JinjaTemplate
from engine.chat.templates import Format, Message, Template
from engine.errors import ChatTemplateError
from engine.tokenize import Tokenizer

_PROBE = [Message("user", "Hello")]
_SENTINEL = "\x01system\x01"


def template_for_model(metadata: dict, tokenizer: Tokenizer, *,
                       default_system: bool = False) -> Template | JinjaTemplate:
    source = metadata.get("tokenizer.chat_template")
    if not source:
        return Template(_family_format(str(metadata.get("general.architecture", ""))))
    builtin = Template.detect(source)
    if builtin is None:
        return own_template(source, tokenizer)
    if not default_system:
        return builtin
    return Template(builtin.format, default_system=own_default_system(builtin, own_template(source, tokenizer)))


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
