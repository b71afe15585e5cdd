"""Built-in chat formats: the spec's examples, llama.cpp's golden renders, the models' own templates."""

import pytest

from engine.chat import Format, JinjaTemplate, Message, Template, template_for_model
from engine.chat.model_template import own_template
from engine.errors import ChatTemplateError, EmptyMessages, SystemMidConversation, TrailingAssistantMessage
from tests.engine.chat.conftest import byte_level_chatml_tokenizer
from tests.golden import golden

S, U, A = "system", "user", "assistant"


def msgs(*pairs):
    return [Message(role, content) for role, content in pairs]


def test_detect_from_gguf_metadata_and_render_a_turn():
    t = Template.detect("... {{ '<|im_start|>' }} ...")
    assert t.format is Format.CHATML and t.stop_marker == "<|im_end|>"
    assert t.render_turn("Hi", system="Be terse.", first=True) == (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("source,fmt,stop", [
    ("{{ '<|start_header_id|>' + role }}", Format.LLAMA3, "<|eot_id|>"),
    ("{{ '<|turn>' + role }}", Format.GEMMA4, "<turn|>"),
    ("{{ '<start_of_turn>' + role }}", Format.GEMMA, "<end_of_turn>"),
])
def test_detect_every_format(source, fmt, stop):
    t = Template.detect(source)
    assert t.format is fmt and t.stop_marker == stop


@pytest.mark.parametrize("source", [None, "", "{{ messages }}"])
def test_detect_nothing(source):
    assert Template.detect(source) is None


def test_render_a_full_history_stateless_server_shape():
    t = Template(Format.CHATML)
    history = msgs((S, "Be terse."), (U, "Hi"), (A, "<think>\nhm\n</think>\n\nHello!"), (U, "Bye"))
    assert t.render_messages(history, think_off=True) == (
        "<|im_start|>system\nBe terse.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"  # <think> stripped
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_llama3_trims_contents_and_gives_every_system_message_a_block():
    t = Template(Format.LLAMA3)
    assert t.render_messages(msgs((U, " Hi "), (A, "Hello"), (S, "Now terse."), (U, "Bye"))) == (
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
        "<|start_header_id|>system<|end_header_id|>\n\nNow terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_gemma_folds_the_system_prompt_into_the_first_user_turn():
    t = Template(Format.GEMMA)
    assert t.render_messages(msgs((S, "Be terse."), (S, "Use French."), (U, "Hi"), (A, "Salut"), (U, "Bye"))) == (
        "<start_of_turn>user\nBe terse.\n\nUse French.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nSalut<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n")
    assert t.render_turn("Hi", system="Be terse.") == (
        "<start_of_turn>user\nBe terse.\n\nHi<end_of_turn>\n<start_of_turn>model\n")


def test_gemma4_system_slot_thinking_off_and_stripped_reasoning():
    t = Template(Format.GEMMA4)
    history = msgs((S, "Be terse."), (U, "Hi"), (A, "<|channel>thought\nhm<channel|>Hello!"), (U, "Bye"))
    assert t.render_messages(history, think_off=True) == (
        "<|turn>system\nBe terse.<turn|>\n"
        "<|turn>user\nHi<turn|>\n"
        "<|turn>model\nHello!<turn|>\n"
        "<|turn>user\nBye<turn|>\n"
        "<|turn>model\n<|channel>thought\n<channel|>")


@pytest.mark.parametrize("fmt", list(Format))
def test_history_errors(fmt):
    t = Template(fmt)
    with pytest.raises(EmptyMessages):
        t.render_messages([])
    with pytest.raises(TrailingAssistantMessage):
        t.render_messages(msgs((U, "Hi"), (A, "Hello")))
    with pytest.raises(ChatTemplateError, match="role"):
        t.render_messages(msgs((U, "Hi"), (A, "Hello"), ("tool", "42"), (U, "ok")))


@pytest.mark.parametrize("fmt", [Format.GEMMA, Format.GEMMA4])
def test_a_late_system_message_is_an_error_in_gemma(fmt):
    with pytest.raises(SystemMidConversation):
        Template(fmt).render_messages(msgs((U, "Hi"), (A, "Hello"), (S, "Now terse."), (U, "Bye")))


@pytest.mark.parametrize("fmt", list(Format))
@pytest.mark.parametrize("system", [None, "Be terse."])
def test_turn_by_turn_renders_concatenate_to_the_full_history(fmt, system):
    """A conversation fed turn by turn (replies in between, stop markers not fed) prefills exactly the
    text a fresh render of the same history does."""
    t = Template(fmt)
    turns = [("Hi", "Hello!"), ("How are you?", "Fine."), ("Bye", None)]
    fed, history = "", [Message(S, system)] if system else []
    for i, (user, reply) in enumerate(turns):
        fed += t.render_turn(user, system=system, first=i == 0)
        history.append(Message(U, user))
        if reply:
            fed += reply
            history.append(Message(A, reply))
    assert fed == t.render_messages(history)


@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "gemma-3-270m"])
def test_golden_renders_byte_exact(model, real_model):
    """llama.cpp's rendering of a one-turn chat, and its prompt ids through the tokenizer's BOS policy."""
    m, tok = real_model(model)
    template = template_for_model(m.file.metadata, tok)
    for case in golden(model)["greedy"]:
        assert template.render_messages([Message(U, case["user"])]) == case["rendered"]
        assert template.render_turn(case["user"]) == case["rendered"]
        assert tok.encode(case["rendered"]) == case["prompt_ids"]


HISTORIES = [
    msgs((U, "Hi")),
    msgs((U, "Hi"), (A, "Hello! How can I help?"), (U, "Tell me a joke."), (A, "Why did the chicken..."),
         (U, "Another one")),
    msgs((S, "You are terse."), (U, "Hi")),
    msgs((S, "You are terse."), (U, "Hi"), (A, "Hello."), (U, "What is 2+2?"), (A, "4"), (U, "And 3+3?")),
]


@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
@pytest.mark.parametrize("history", HISTORIES, ids=["one turn", "three turns", "system", "system, three turns"])
def test_builtin_format_matches_the_models_own_jinja_template(model, history, real_model):
    m, tok = real_model(model)
    builtin = template_for_model(m.file.metadata, tok, default_system=True)
    assert builtin.default_system  # both models insert one into chats without a system prompt
    own = own_template(m.file.metadata["tokenizer.chat_template"], tok)
    assert builtin.render_messages(history) == own.render_messages(history)


def test_a_model_without_a_template_gets_its_familys_format(real_model):
    m, tok = real_model("gemma-3-270m")
    assert "tokenizer.chat_template" not in m.file.metadata
    assert template_for_model(m.file.metadata, tok) == Template(Format.GEMMA)
    assert template_for_model({"general.architecture": "llama"}, tok) == Template(Format.CHATML)


@pytest.mark.parametrize("source", [
    "{% for m in messages %}",  # does not compile
    "{{ raise_exception('unsupported') }}",
    "{{ ((9 ** 4096) ** 4096) > 1 }}",
    "{% for i in range(10**5) %}{% for j in range(10**5) %}{% endfor %}{% endfor %}",
])
@pytest.mark.parametrize("arch, fmt", [("gemma3", Format.GEMMA), ("llama", Format.CHATML)])
def test_a_template_that_cannot_render_a_chat_falls_back_to_the_familys_format(source, arch, fmt, caplog):
    metadata = {"general.architecture": arch, "tokenizer.chat_template": source}
    assert template_for_model(metadata, byte_level_chatml_tokenizer()) == Template(fmt)
    assert f"using the {fmt.value} format instead" in caplog.text and "chat template" in caplog.text


@pytest.mark.parametrize("source", [7, ["<|im_start|>"], 1.5])
def test_a_chat_template_that_is_not_text_falls_back_to_the_familys_format(source, caplog):
    metadata = {"general.architecture": "gemma3", "tokenizer.chat_template": source}
    assert template_for_model(metadata, byte_level_chatml_tokenizer()) == Template(Format.GEMMA)
    assert "tokenizer.chat_template is" in caplog.text and "not text" in caplog.text


def test_a_builtin_format_template_that_cannot_render_keeps_the_builtin_format(caplog):
    metadata = {"general.architecture": "qwen2", "tokenizer.chat_template": "<|im_start|>{% for m in messages %}"}
    assert template_for_model(metadata, byte_level_chatml_tokenizer(), default_system=True) == Template(Format.CHATML)
    assert "does not compile" in caplog.text


def test_a_working_template_of_its_own_is_kept():
    source = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}[assistant]"
    template = template_for_model({"general.architecture": "llama", "tokenizer.chat_template": source},
                                  byte_level_chatml_tokenizer())
    assert isinstance(template, JinjaTemplate)
    assert template.render_messages([Message(U, "Hi")]) == "[user]Hi[assistant]"


@pytest.mark.parametrize("fmt, expected", [
    (Format.CHATML, "<|im_start|>system\nDOC<|im_end|>\n"),
    (Format.LLAMA3, "<|start_header_id|>system<|end_header_id|>\n\nDOC<|eot_id|>"),
    (Format.GEMMA, "<start_of_turn>user\nDOC<end_of_turn>\n<start_of_turn>model\n"
                   "I have read the document and will use it to answer.<end_of_turn>\n"),
])
def test_reference_material_is_closed_blocks_a_chat_can_follow(fmt, expected):
    t = Template(fmt)
    # ChatML keeps contents as they are; the others trim them, as their chat turns do
    assert t.render_reference(" DOC ") == expected.replace("DOC", " DOC " if fmt is Format.CHATML else "DOC")


def test_a_models_own_template_presents_reference_material_as_a_system_message():
    t = JinjaTemplate("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
                      "{% if add_generation_prompt %}[assistant]{% endif %}", isolated=False)
    assert t.render_reference("DOC") == "[system]DOC"
