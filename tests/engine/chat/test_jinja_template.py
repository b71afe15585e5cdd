"""A model's own Jinja template: rendered like Hugging Face does, and contained when it is hostile."""

import time

import pytest

from engine.chat import JinjaTemplate, Message
from engine.errors import ChatTemplateError, EmptyMessages, TrailingAssistantMessage

HI = [Message("user", "Hi")]
ZEPHYR = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def test_renders_like_hugging_face():
    t = JinjaTemplate(ZEPHYR, bos_token="<s>", eos_token="</s>")
    assert t.render_messages([Message("system", "Be terse."), *HI]) == (
        "<|system|>\nBe terse.</s>\n<|user|>\nHi</s>\n<|assistant|>\n")
    assert t.render(HI, add_generation_prompt=False) == "<|user|>\nHi</s>\n"
    assert t.stop_marker is None


def test_helpers_and_flags():
    src = ("{{ bos_token }}{% if enable_thinking is defined and not enable_thinking %}[no-think]{% endif %}"
           "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content | tojson }}"
           "{% endfor %}")
    t = JinjaTemplate(src, bos_token="<s>", strip_bos=True)
    assert t.render([Message("user", "café"), Message("user", "x")]) == '"café"'  # BOS dropped, non-ASCII kept
    assert t.render(HI, think_off=True) == '[no-think]"Hi"'
    assert JinjaTemplate("{{ strftime_now('%Y') }}").render(HI).isdigit()


def test_history_errors_and_template_errors():
    t = JinjaTemplate(ZEPHYR)
    with pytest.raises(EmptyMessages):
        t.render_messages([])
    with pytest.raises(TrailingAssistantMessage):
        t.render_messages([*HI, Message("assistant", "Hello")])
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        JinjaTemplate("{{ raise_exception('roles must alternate') }}").render(HI)
    with pytest.raises(ChatTemplateError, match="does not compile"):
        JinjaTemplate("{% for m in messages %}")


@pytest.mark.parametrize("source", [
    "{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}",
    "{{ messages.append(1) }}",
    "{{ 'x'.format(1) }}",
    "{{ cycler.__init__.__globals__ }}",
])
def test_the_sandbox_holds(source):
    try:
        out = JinjaTemplate(source).render(HI)
    except ChatTemplateError:
        return
    assert "class" not in out and "builtins" not in out


@pytest.mark.parametrize("source", [
    "{{ 'a' * 100000000 }}",
    "{{ 100000000 * ['a'] }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{{ 'x' | center(1000000000) }}",
    "{{ 'x'.ljust(1000000000) }}",
    "{{ '%999999999d' % 3 }}",
    "{{ ('a' * 1000000).replace('a', 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb') }}",
    "{{ ('a' * 1000000) | replace('a', 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb') }}",
    "{{ ('a' * 1000000).join(['x', 'y', 'z', 'w', 'v']) * 4 }}",
    "{{ 10 ** 100000000 }}",
    "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
])
def test_output_size_is_bounded(source):
    with pytest.raises(ChatTemplateError, match="more than 4000000 characters"):
        JinjaTemplate(source, max_output=4_000_000).render(HI)


@pytest.mark.parametrize("source", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}",
])
def test_render_time_is_bounded(source):
    start = time.monotonic()
    with pytest.raises(ChatTemplateError):
        JinjaTemplate(source, time_limit_s=0.3).render(HI)
    assert time.monotonic() - start < 3.0


def test_runaway_recursion_is_an_error():
    with pytest.raises(ChatTemplateError, match="RecursionError"):
        JinjaTemplate("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").render(HI)
