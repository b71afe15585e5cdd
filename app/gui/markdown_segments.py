"""Split Markdown into prose and fenced code blocks, so each code block can get its own widget (syntax
highlighting and a copy button) while the prose goes to Qt's Markdown renderer.

A fence that is still open (a reply mid-stream) runs to the end of the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")


@dataclass(frozen=True)
class Segment:
    kind: str        # "prose" | "code"
    text: str
    language: str = ""


def split_markdown(text: str) -> list[Segment]:
    segments: list[Segment] = []
    prose: list[str] = []
    code: list[str] = []
    fence, language = None, ""
    for line in text.split("\n"):
        if fence is None:
            match = _FENCE.match(line)
            if match:
                fence, language = match.group(1), match.group(2)
                if prose:
                    segments.append(Segment("prose", "\n".join(prose)))
                    prose = []
            else:
                prose.append(line)
        elif line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
            segments.append(Segment("code", "\n".join(code), language))
            fence, code = None, []
        else:
            code.append(line)
    if fence is not None:
        segments.append(Segment("code", "\n".join(code), language))
    elif any(line.strip() for line in prose):
        segments.append(Segment("prose", "\n".join(prose)))
    return [s for s in segments if s.kind == "code" or s.text.strip()]
