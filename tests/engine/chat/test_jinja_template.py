"""A model's own Jinja template: rendered like Hugging Face does, and contained when it is hostile."""

import resource
import sys
import threading
import time

import pytest

from engine.chat import JinjaTemplate, Message
from engine.chat import jinja_template
from engine.chat.render_process import ProcessUnavailable
from engine.errors import ChatTemplateError, EmptyMessages, TrailingAssistantMessage

# Every containment test runs in both layers: the renderer process, and in-process operator checks alone.
LAYERS = pytest.mark.parametrize("isolated", [True, False], ids=["process", "in-process"])

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
    lazy = "{{ messages|selectattr('role', 'eq', 'user')|map(attribute='content')|join('+') }}"
    assert JinjaTemplate(lazy).render([Message("user", "a"), Message("assistant", "b"), Message("user", "c")]) == "a+c"
    assert JinjaTemplate("{% for m in messages %}{{ loop|length }}{% endfor %}").render([*HI, *HI]) == "22"


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
@LAYERS
def test_output_size_is_bounded(source, isolated):
    with pytest.raises(ChatTemplateError, match="more than 4000000 characters"):
        JinjaTemplate(source, max_output=4_000_000, isolated=isolated).render(HI)


@pytest.mark.parametrize("source", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}",
])
@LAYERS
def test_render_time_is_bounded(source, isolated):
    template = JinjaTemplate(source, time_limit_s=0.3, isolated=isolated)
    start = time.monotonic()
    with pytest.raises(ChatTemplateError):
        template.render(HI)
    assert time.monotonic() - start < 3.0


@LAYERS
def test_runaway_recursion_is_an_error(isolated):
    with pytest.raises(ChatTemplateError, match="RecursionError"):
        JinjaTemplate("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", isolated=isolated).render(HI)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


# Hostile templates that C code used to run away with (seconds, gigabytes) and the list.
@pytest.mark.parametrize("source", [
    "{{ ((9 ** 4096) ** 4096) > 1 }}",
    "{{ range(300)|join('x' * 16000000) }}",
    '{{ "%999999999s"|format("x") }}',
    "{{ 9.0 ** 4096.0 }}",
    "{{ (2 ** 4000) ** 4000 }}",
    "{{ 'x' * 10**9 }}",
    "{{ [0] * 10**9 }}",
    "{% for i in range(10**5) %}{% for j in range(10**5) %}{% endfor %}{% endfor %}",
    '{{ "{:>999999999}".format("x") }}',
    "{{ 'x'|center(10**9) }}",
    "{% macro f(s) %}{{ f(s ~ s) }}{% endmacro %}{{ f('ab') }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{{ ('%*s' * 100) % ((10**7, 'x') * 100) }}",
    "{{ ('%9999999s' * 100)|format(*(['x'] * 100)) }}",
    "{{ ('a\n' * 1000)|indent(10**7) }}",
    "{{ ('a' * 100000)|wordwrap(1, wrapstring='x' * 10000) }}",
    "{{ (messages * 1000)|tojson(indent=100000) }}",
    "{{ ('x' * 10**6).join(range(1000)|map('string')) }}",
    "{{ ('x' * 1000)|join('y' * 1000000) }}",
    "{{ ('ab' * 1000).translate({97: 'y' * 10**6}) }}",
])
@LAYERS
def test_hostile_templates_fail_fast_and_small(source, isolated):
    before = _peak_rss()
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match="chat template"):
        JinjaTemplate(source, isolated=isolated).render(HI)
    assert time.monotonic() - start < jinja_template.TIME_LIMIT_S + 1.0
    assert _peak_rss() - before < jinja_template.MEMORY_LIMIT


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is enforced on Linux only")
@pytest.mark.parametrize("source", [
    "".join("{%% set v%d = 'x' * 16000000 ~ %d %%}" % (i, i) for i in range(40)),  # each value in bounds
    "{{ ('ab ' * 5000000).split()|length }}",  # millions of small objects from one C call
])
def test_the_renderer_process_bounds_memory_the_checks_cannot(source):
    before = _peak_rss()
    with pytest.raises(ChatTemplateError, match="needs more than 256 MB of memory"):
        # time enough to fill 256 MB where fresh memory faults in slowly (a VM's host gives it back page by
        # page): the 2 s deadline fired first in one full run
        JinjaTemplate(source, time_limit_s=30).render(HI)
    assert _peak_rss() - before < 64 << 20


def test_the_renderer_process_is_killed_at_the_deadline_and_replaced():
    """One C call that the in-process trace hook cannot interrupt: a regex over the 8M words of a message. The
    message comes built (the child receives it before its deadline starts); built inside the template, the
    string took a C call of its own, and where that outlasted the deadline the child's trace hook answered
    before the kill."""
    template = JinjaTemplate("{{ messages[0].content|wordcount }}", time_limit_s=0.05)
    words = [Message("user", "a " * 8_000_000)]
    first = jinja_template.RENDERER.pid
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match="ran longer than 0.05 s"):
        template.render(words)
    assert time.monotonic() - start < 0.05 + 0.5
    assert JinjaTemplate(ZEPHYR).render(HI) == "<|user|>\nHi\n<|assistant|>\n"
    assert jinja_template.RENDERER.pid not in (None, first)


def test_renders_in_process_where_no_renderer_process_can_start(monkeypatch):
    def unavailable(*args, **kwargs):
        raise ProcessUnavailable("no child processes here")

    monkeypatch.setattr(jinja_template.RENDERER, "call", unavailable)
    template = JinjaTemplate(ZEPHYR)
    assert not template.isolated
    assert template.render(HI) == "<|user|>\nHi\n<|assistant|>\n"
    with pytest.raises(ChatTemplateError, match="more than"):
        JinjaTemplate("{{ 'x' * 10**9 }}").render(HI)


def test_other_threads_run_while_a_hostile_render_runs_out_its_time():
    """The app's threads (the GUI's) keep running: the waiting thread holds no GIL, unlike C code
    running in-process."""
    # each wordcount holds the GIL for a few tenths of a second (C code); repeated, the render outlasts its
    # time on any machine (one alone finished inside 0.5 s on a fast one)
    template = JinjaTemplate("{% for i in range(20) %}{{ ('a ' * 8000000)|wordcount }}{% endfor %}", time_limit_s=0.5)
    errors = []

    def run():
        try:
            template.render(HI)
        except ChatTemplateError as e:
            errors.append(e)

    render = threading.Thread(target=run)
    render.start()
    longest, last = 0.0, time.monotonic()
    while render.is_alive():
        time.sleep(0.01)
        now = time.monotonic()
        longest, last = max(longest, now - last), now
    render.join()
    assert longest < 0.2
    assert "ran longer than 0.5 s" in str(errors[0])
