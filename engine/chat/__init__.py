"""Chat (spec 13.8): templates and multi-turn conversations over one KV cache."""

from engine.chat.conversation import Conversation, WarmState
from engine.chat.jinja_template import JinjaTemplate
from engine.chat.lockstep import send_batch, send_batch_rendered
from engine.chat.model_template import template_for_model
from engine.chat.options import ChatOptions
from engine.chat.templates import Format, Message, Template
from engine.chat.turn import TurnResult, TurnStats

__all__ = ["ChatOptions", "Conversation", "Format", "JinjaTemplate", "Message", "Template", "TurnResult",
           "TurnStats", "WarmState", "send_batch", "send_batch_rendered", "template_for_model"]
