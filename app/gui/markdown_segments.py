"""Split Markdown into prose, fenced code blocks, block quotes and display math (`$$…$$`), so each of the
last three gets its own widget (code: highlighting and a copy button; a quote: a bar beside it; math: a
line of its own) while the prose goes to Qt's Markdown renderer.

A fence or a `$$` that is still open (a reply mid-stream) runs to the end of the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")
_QUOTE = re.compile(r"^ {0,3}> ?")
_MATH = "$$"


@dataclass(frozen=True)
class Segment:
    kind: str        # "prose" | "code" | "quote" | "math"
    text: str
    language: str = ""


def split_markdown(text: str) -> list[Segment]:
    segments: list[Segment] = []
    run: list[str] = []       # the lines of the segment being read
    kind = "prose"
    fence, language = None, ""

    def close(next_kind: str) -> None:
        nonlocal run, kind
        segments.append(Segment(kind, "\n".join(run), language if kind == "code" else ""))
        run, kind = [], next_kind

    for line in text.split("\n"):
        stripped = line.strip()
        if kind == "code":
            if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                close("prose")
            else:
                run.append(line)
        elif kind == "math":
            if stripped.endswith(_MATH):
                run.append(stripped[:-len(_MATH)])
                close("prose")
            else:
                run.append(line)
        elif match := _FENCE.match(line):
            close("code")
            fence, language = match.group(1), match.group(2)
        elif stripped.startswith(_MATH):
            close("math")
            rest = stripped[len(_MATH):]
            if rest.endswith(_MATH):  # $$…$$ on one line
                run.append(rest[:-len(_MATH)])
                close("prose")
            else:
                run.append(rest)
        elif match := _QUOTE.match(line):
            if kind != "quote":
                close("quote")
            run.append(line[match.end():])
        else:
            if kind == "quote":
                close("prose")
            run.append(line)
    close("prose")
    return [s for s in segments if s.kind == "code" or s.text.strip()]
