"""Syntax highlighting for code blocks: Pygments tokens as inline-styled HTML that Qt's rich text renders."""

from __future__ import annotations

import html
from functools import lru_cache

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

LIGHT_STYLE, DARK_STYLE = "default", "github-dark"


@lru_cache(maxsize=None)
def _formatter(style: str) -> HtmlFormatter:
    # noclasses: Qt's rich text has no style sheet for Pygments' classes; nowrap: we add our own <pre>
    return HtmlFormatter(style=style, noclasses=True, nowrap=True)


@lru_cache(maxsize=64)
def _lexer(language: str):
    try:
        return get_lexer_by_name(language, stripnl=False, ensurenl=False) if language else None
    except ClassNotFound:
        return None


def code_background(dark: bool) -> str:
    return _formatter(DARK_STYLE if dark else LIGHT_STYLE).style.background_color


def highlight_html(code: str, language: str, dark: bool) -> str:
    """`code` as a <pre> block, coloured when `language` names a known lexer, plain otherwise."""
    lexer = _lexer(language.lower())
    body = html.escape(code) if lexer is None else highlight(code, lexer, _formatter(DARK_STYLE if dark else LIGHT_STYLE))
    return f'<pre style="white-space: pre-wrap; margin: 0">{body}</pre>'
