"""Tool calls as text: each family's format told from its template, calls parsed back (malformed text is no
call), the tools rendered for Qwen2.5 by its own template and for a template without tools by the Hermes
fallback, the streamed text's calls held back, and the call grammars compiled for every format."""

import json

import pytest

from engine.chat import Message, template_for_model
from engine.chat.jinja_template import JinjaTemplate
from engine.chat.tool_format import HARMONY, HERMES, LLAMA3, MISTRAL, detect_tool_format
from engine.chat.tool_grammar import call_grammar
from engine.chat.tool_render import as_plain_messages, render_with_tools, tool_format_of
from engine.chat.reasoning import Thought
from engine.chat.tool_rounds import ToolRan
from engine.chat.tool_text import CallTextFilter, without_call_text
from engine.chat.tool_use import ToolUse, specs_from_openai
from engine.tools import ToolCall, ToolResult, ToolSpec

WEATHER = ToolSpec("get_weather", "Get the weather", {"type": "object", "properties": {"city": {"type": "string"}},
                                                      "required": ["city"]})


# -- parsing per family --------------------------------------------------------------------------------

def test_hermes_calls_are_parsed_and_the_text_around_them_kept():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    parsed = HERMES.parse(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert parsed.content == "Let me check."
    assert len({c.id for c in parsed.calls}) == 2 and all(c.id.startswith("call_") for c in parsed.calls)


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',  # cut off: never closed
    '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>',  # arguments no object
    '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>',  # no name
    '<tool_call>\nget_weather(city="Paris")\n</tool_call>',  # not JSON
    'I would call get_weather with {"city": "Paris"}.',
])
def test_malformed_hermes_text_is_not_a_call_and_stays_text(text):
    parsed = HERMES.parse(text)
    assert parsed.calls == () and parsed.content == text


def test_a_bare_hermes_call_is_a_call_only_to_an_offered_tool():
    bare = '{"name": "get_weather", "arguments": {"city": "Paris"}}'  # as Qwen2.5-Coder writes it untagged
    assert HERMES.parse(bare, names={"get_weather"}).calls[0].arguments == {"city": "Paris"}
    assert HERMES.parse(bare, names={"get_time"}).calls == ()
    assert HERMES.parse(bare).calls == ()  # no tools named: nothing to tell a call from JSON
    assert HERMES.parse("Here: " + bare, names={"get_weather"}).calls == ()  # not the whole reply
    tagged = f"<tool_call>{bare}</tool_call>"
    assert HERMES.parse(tagged, names={"get_time"}).content == tagged  # a call to another tool is text


def test_hermes_arguments_written_as_a_json_string_are_read():
    parsed = HERMES.parse('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert parsed.calls[0].arguments == {"x": 1}


def test_llama3_calls_are_the_whole_reply():
    parsed = LLAMA3.parse('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}')
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", {"city": "Oslo"})]
    assert parsed.content == ""
    prose = 'The JSON would be {"name": "get_weather", "parameters": {"city": "Oslo"}}'
    assert LLAMA3.parse(prose).calls == ()


def test_harmony_calls_name_the_function_in_the_header():
    text = ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Rome"}'
            '<|call|>')
    parsed = HARMONY.parse(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", {"city": "Rome"})]
    assert HARMONY.parse('<|channel|>commentary to=functions.f<|message|>{"oops"').calls == ()


def test_harmony_calls_are_read_from_the_raw_reply_whose_headers_the_split_consumed():
    raw = ('<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary '
           'to=functions.get_weather <|constrain|>json<|message|>{"city": "Rome"}')  # stopped on <|call|>
    parsed = HARMONY.parse_reply(raw, answer='{"city": "Rome"}')  # what the split left of it as answer
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", {"city": "Rome"})]
    assert parsed.content == ""
    assert HERMES.parse_reply("<tool_call>raw only</tool_call>", answer="Hi").content == "Hi"


def test_mistral_calls_in_both_forms():
    listed = MISTRAL.parse('[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]')
    assert [(c.name, c.arguments) for c in listed.calls] == [("a", {"x": 1}), ("b", {})]
    named = MISTRAL.parse('[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}')
    assert [(c.name, c.arguments) for c in named.calls] == [("get_weather", {"city": "Lyon"})]
    assert MISTRAL.parse('[TOOL_CALLS][{"name": "a"}]').calls == ()


def test_the_format_is_told_from_the_template_text():
    assert detect_tool_format("... <tool_call>\\n{...}</tool_call> ...") is HERMES
    assert detect_tool_format("{%- if tools %}<|start_header_id|> ... \"parameters\": ...") is LLAMA3
    assert detect_tool_format("<|start|>assistant<|channel|>commentary to=functions.' + name") is HARMONY
    assert detect_tool_format("[AVAILABLE_TOOLS] ... [TOOL_CALLS]") is MISTRAL
    assert detect_tool_format("{{ messages }}") is HERMES  # no tool support: the fallback's format
    assert detect_tool_format(None) is HERMES


# -- rendering -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen_template(model_path):
    from engine.gguf.reader import open_gguf
    from engine.tokenize import load_tokenizer

    metadata = open_gguf(model_path("qwen2.5-coder-0.5b-instruct")).metadata
    tokenizer = load_tokenizer(metadata)
    return template_for_model(metadata, tokenizer), tokenizer


def test_qwen25_renders_tools_calls_and_results_through_its_own_template(qwen_template):
    template, _ = qwen_template
    assert tool_format_of(template) is HERMES
    call = ToolCall("call_1", "get_weather", {"city": "Paris"})
    chat = [Message("user", "Weather in Paris?"), Message("assistant", "", tool_calls=(call,)),
            Message.tool_result(call, ToolResult("call_1", '{"sky": "clear"}')), Message("user", "Thanks!")]
    text = render_with_tools(template, chat, [WEATHER])
    assert "# Tools" in text and json.dumps(WEATHER.as_openai()) in text  # the template's tojson of the tool
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n' \
           '</tool_call><|im_end|>' in text
    assert '<|im_start|>user\n<tool_response>\n{"sky": "clear"}\n</tool_response><|im_end|>' in text
    assert text.endswith("<|im_start|>assistant\n")
    plain = render_with_tools(template, [Message("user", "Hi")], [])
    assert "# Tools" not in plain and plain == template.render_messages([Message("user", "Hi")])


def test_a_template_without_tools_gets_them_described_in_hermes():
    template = JinjaTemplate("{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}", isolated=False)
    assert tool_format_of(template) is HERMES
    call = ToolCall("call_1", "get_weather", {"city": "Paris"})
    chat = [Message("system", "Be brief."), Message("user", "Weather?"),
            Message("assistant", "Checking.", tool_calls=(call,)),
            Message.tool_result(call, ToolResult("call_1", "sunny")),
            Message.tool_result(call, ToolResult("call_1", "warm"))]
    plain = as_plain_messages(chat, [WEATHER])
    assert [m.role for m in plain] == ["system", "user", "assistant", "user"]
    assert plain[0].content.startswith("Be brief.\n\n# Tools") and '"name": "get_weather"' in plain[0].content
    assert HERMES.parse(plain[2].content).calls[0].arguments == {"city": "Paris"}
    assert plain[3].content == "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nwarm\n</tool_response>"
    assert "[user]<tool_response>" in render_with_tools(template, chat, [WEATHER])


# -- tool choice and specs -------------------------------------------------------------------------------

def test_tool_choice_and_openai_tools_are_checked():
    assert ToolUse((WEATHER,), "get_weather").must_call and not ToolUse((WEATHER,), "none").active
    with pytest.raises(ValueError, match="tool_choice"):
        ToolUse((WEATHER,), "get_time")
    with pytest.raises(ValueError, match="unique"):
        ToolUse((WEATHER, WEATHER))
    with pytest.raises(ValueError, match=r"tools\[0\].function.parameters"):
        specs_from_openai([{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}])
    with pytest.raises(ValueError, match="array"):
        specs_from_openai({"name": "f"})


def test_a_chats_choice_its_tools_now_cannot_honour_is_auto():
    assert ToolUse.available([WEATHER], "get_weather") == ToolUse((WEATHER,), "get_weather")
    assert ToolUse.available([WEATHER], "get_time").choice == "auto"  # a tool not there now (a server down)
    assert ToolUse.available([], "required") == ToolUse((), "auto")  # nothing to call: no call required
    assert ToolUse.available([WEATHER], "required").must_call and not ToolUse.available([WEATHER], "none").active


# -- streamed text -----------------------------------------------------------------------------------------

def test_streamed_text_is_held_back_from_the_call_opener_on():
    f = CallTextFilter("<tool_call>")
    shown = [f.push(p) for p in ["Sure", ", <", "tool", "_call>\n{", '"name"']]
    assert "".join(shown) == "Sure, " and f.calling
    g = CallTextFilter("<tool_call>")
    assert g.push("a <to") == "a " and g.push("y") == "<toy" and g.push(" <") == " " and g.finish() == "<"


def test_a_tool_turns_stream_shows_each_replys_text_without_its_calls():
    """Every round's reply is held back from its call's opener on; reasoning, the calls that ran and the
    next round's text pass, and a reply without a call keeps its whole text."""
    call = ToolCall("c1", "get_weather", {"city": "Rome"})
    ran = ToolRan(call, ToolResult("c1", "21 C"))
    closed = []

    def rounds():
        try:
            yield from [Thought("the user asks"), "Let me check. <tool", '_call>\n{"name": "get_weather"}',
                        "</tool_call>", ran, Thought("it is warm"), "It is 21 ", "degrees <"]
        finally:
            closed.append(True)

    shown = list(without_call_text(rounds(), "<tool_call>"))
    assert shown == [Thought("the user asks"), "Let me check. ", ran, Thought("it is warm"), "It is 21 ", "degrees ",
                     "<"]
    assert [type(p) for p in shown[:4]] == [Thought, str, ToolRan, Thought]
    stream = without_call_text(rounds(), "<tool_call>")
    next(stream)
    stream.close()  # a stopped turn: the rounds end now, restoring what they changed
    assert closed == [True, True]


# -- call grammars ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [HERMES, LLAMA3, MISTRAL, HARMONY])
def test_every_format_has_a_call_grammar_over_the_tools(qwen_template, fmt):
    _, tokenizer = qwen_template
    other = ToolSpec("get_time", "", {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}})
    grammar = call_grammar(fmt, [WEATHER, other], tokenizer)
    assert "get_weather" in grammar.source and "get_time" in grammar.source
    if fmt is HERMES:  # Qwen2.5's closer is one special token, which the grammar names by id
        assert f"<[{tokenizer.token_id('</tool_call>')}]>" in grammar.source
