"""A tiny random model whose vocabulary has Qwen3's reasoning markers as tokens of their own: no starter
model reasons, so reasoning replies are tested on it, with scripted replies."""

from gguf import GGUFValueType as V

from tests.engine.chat.conftest import byte_level_chatml_metadata
from tests.synthetic import write_tiny_model

# Qwen3's template in short: a past reply's reasoning is rendered only after the last user message
QWEN3_LIKE_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.role == 'assistant' and m.reasoning_content and loop.index0 > ns.last_user %}"
    "{{ '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{ m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")


def reasoning_metadata() -> dict:
    """The byte-level ChatML tokenizer with <think> and </think> as single (user-defined) tokens, and the
    Qwen3-like template."""
    meta = byte_level_chatml_metadata()
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"] + ["<think>", "</think>"]
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"] + [4, 4]
    meta["tokenizer.chat_template"] = QWEN3_LIKE_TEMPLATE
    return meta


def write_reasoning_model(path):
    kinds = {str: V.STRING, bool: V.BOOL, int: V.UINT32, list: V.ARRAY}
    metadata = {k: (v, kinds[type(v)]) for k, v in reasoning_metadata().items()}
    write_tiny_model(path, "llama", vocab=len(metadata["tokenizer.ggml.tokens"][0]), metadata=metadata)
    return path


HARMONY_MARKERS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"]
# gpt-oss's template in short: the generation prompt opens an assistant message whose channel the model writes
HARMONY_LIKE_TEMPLATE = (
    "{%- for m in messages %}{{ '<|start|>' + m.role + '<|message|>' + m.content + '<|end|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start|>assistant' }}{%- endif %}"
    "{#- analysis and final channels, as gpt-oss writes them: <|channel|>analysis #}")


def harmony_metadata() -> dict:
    """The byte-level vocabulary with gpt-oss's harmony markers as control tokens, <|return|> its end."""
    meta = byte_level_chatml_metadata()
    tokens = meta["tokenizer.ggml.tokens"] + HARMONY_MARKERS
    meta["tokenizer.ggml.tokens"] = tokens
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"] + [3] * len(HARMONY_MARKERS)
    meta["tokenizer.ggml.eos_token_id"] = tokens.index("<|return|>")
    meta["tokenizer.chat_template"] = HARMONY_LIKE_TEMPLATE
    return meta


def write_harmony_model(path):
    kinds = {str: V.STRING, bool: V.BOOL, int: V.UINT32, list: V.ARRAY}
    metadata = {k: (v, kinds[type(v)]) for k, v in harmony_metadata().items()}
    write_tiny_model(path, "llama", vocab=len(metadata["tokenizer.ggml.tokens"][0]), metadata=metadata)
    return path
