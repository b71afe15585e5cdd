"""Chats whose replies follow a grammar: the processor wired to the template's stop token."""

from __future__ import annotations

import dataclasses

from engine.chat.conversation import ChatOptions
from engine.chat.jinja_template import JinjaTemplate
from engine.chat.model_template import stop_token_id
from engine.chat.templates import Template
from engine.sampling.grammar import Grammar, grammar_processor
from engine.tokenize import Tokenizer


def with_grammar(options: ChatOptions, grammar: Grammar | None, tokenizer: Tokenizer,
                 template: Template | JinjaTemplate) -> ChatOptions:
    """`options` holding every reply to `grammar` (None: free text); a finished reply ends with the
    template's stop token, through the conversation's normal stop handling."""
    if grammar is None:
        return options
    processor = grammar_processor(grammar, tokenizer, stop_token_id(tokenizer, template))
    return dataclasses.replace(options, processor=processor)
