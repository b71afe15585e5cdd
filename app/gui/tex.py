"""TeX math written as readable Unicode text: `\\alpha^2 \\le \\frac{a}{b}` -> `α² ≤ a⁄b`.

Models write `$…$` math; Qt renders no TeX and the app loads nothing from the network, so the common part
of TeX (Greek, operators, relations, fractions, roots, super- and subscripts, \\mathbb, \\text) becomes
Unicode, and whatever is not known stays as written, which is still readable.
"""

from __future__ import annotations

import re

SYMBOLS = {
    **dict(zip("alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi "
               "pi rho sigma tau upsilon phi varphi chi psi omega".split(),
               "αβγδεεζηθϑικλμνξπρστυφφχψω")),
    **dict(zip("Gamma Delta Theta Lambda Xi Pi Sigma Phi Psi Omega".split(), "ΓΔΘΛΞΠΣΦΨΩ")),
    "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "neq": "≠", "ne": "≠", "approx": "≈", "equiv": "≡",
    "sim": "∼", "propto": "∝", "times": "×", "cdot": "·", "div": "÷", "pm": "±", "mp": "∓", "infty": "∞",
    "sum": "∑", "prod": "∏", "int": "∫", "oint": "∮", "partial": "∂", "nabla": "∇", "to": "→",
    "rightarrow": "→", "leftarrow": "←", "Rightarrow": "⇒", "Leftarrow": "⇐", "iff": "⇔", "implies": "⇒",
    "mapsto": "↦", "in": "∈", "notin": "∉", "subset": "⊂", "subseteq": "⊆", "cup": "∪", "cap": "∩",
    "emptyset": "∅", "forall": "∀", "exists": "∃", "neg": "¬", "land": "∧", "lor": "∨", "ldots": "…",
    "cdots": "⋯", "dots": "…", "circ": "∘", "deg": "°", "angle": "∠", "perp": "⊥", "star": "⋆",
    "langle": "⟨", "rangle": "⟩", "lfloor": "⌊", "rfloor": "⌋", "lceil": "⌈", "rceil": "⌉", "|": "‖",
    ",": " ", ";": " ", ":": " ", "!": "", "quad": "  ", "qquad": "    ", " ": " ", "{": "{", "}": "}",
    "%": "%", "$": "$", "#": "#", "&": "&", "_": "_",
    "left": "", "right": "", "big": "", "Big": "", "bigg": "", "displaystyle": "",
}
FUNCTIONS = set("log ln lg exp sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh lim max min sup inf "
                "det gcd arg mod bmod Pr".split())
TEXT_COMMANDS = set("text mathrm mathit mathbf mathsf mathtt operatorname textbf textit boldsymbol".split())
BLACKBOARD = dict(zip("RNZQCPH", "ℝℕℤℚℂℙℍ"))
SUPERSCRIPTS = dict(zip("0123456789+-=()nixyabcdefghjklmoprstuvwz",
                        "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱˣʸᵃᵇᶜᵈᵉᶠᵍʰʲᵏˡᵐᵒᵖʳˢᵗᵘᵛʷᶻ"))
SUBSCRIPTS = dict(zip("0123456789+-=()aehijklmnoprstuvx", "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₕᵢⱼₖₗₘₙₒₚᵣₛₜᵤᵥₓ"))
_COMMAND = re.compile(r"\\([A-Za-z]+|.)")


def _group(tex: str, i: int) -> tuple[str, int]:
    """The argument starting at `tex[i]` (a {braced group}, a \\command or one character) and the index
    after it."""
    while i < len(tex) and tex[i] == " ":
        i += 1
    if i >= len(tex):
        return "", i
    if tex[i] == "{":
        depth = 0
        for j in range(i, len(tex)):
            depth += {"{": 1, "}": -1}.get(tex[j], 0)
            if depth == 0:
                return tex[i + 1:j], j + 1
        return tex[i + 1:], len(tex)  # unbalanced: the rest
    if match := _COMMAND.match(tex, i):
        return match.group(0), match.end()
    return tex[i], i + 1


def _script(text: str, table: dict[str, str], mark: str) -> str:
    """Super- or subscript `text`: in Unicode when every character has a form, else as ^(…) / _(…)."""
    if all(ch in table for ch in text):
        return "".join(table[ch] for ch in text)
    return f"{mark}{text}" if len(text) == 1 else f"{mark}({text})"


def _wrapped(text: str) -> str:
    """A fraction's or root's argument, in brackets unless it is one word (`√n` counts as one)."""
    return text if re.fullmatch(r"√?\w+", text) else f"({text})"


def tex_to_unicode(tex: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(tex):
        ch = tex[i]
        if ch == "\\":
            match = _COMMAND.match(tex, i)
            name, i = match.group(1), match.end()
            if name == "frac" or name == "dfrac" or name == "tfrac":
                numerator, i = _group(tex, i)
                denominator, i = _group(tex, i)
                out.append(f"{_wrapped(tex_to_unicode(numerator))}⁄{_wrapped(tex_to_unicode(denominator))}")
            elif name == "sqrt":
                radicand, i = _group(tex, i)
                out.append(f"√{_wrapped(tex_to_unicode(radicand))}")
            elif name == "mathbb":
                letter, i = _group(tex, i)
                out.append(BLACKBOARD.get(letter, letter))
            elif name in TEXT_COMMANDS:
                text, i = _group(tex, i)
                out.append(tex_to_unicode(text))
            elif name in FUNCTIONS:
                out.append(name)
            else:
                out.append(SYMBOLS.get(name, "\\" + name))
        elif ch in "^_":
            argument, i = _group(tex, i + 1)
            out.append(_script(tex_to_unicode(argument), SUPERSCRIPTS if ch == "^" else SUBSCRIPTS, ch))
        elif ch in "{}":
            i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


# $…$ inline: not `$ 5`, not `5$`, and not a price followed by a digit (the rule pandoc uses).
INLINE_MATH = re.compile(r"(?<![\\$])\$(?=[^\s$])((?:[^$\\\n]|\\.)+?)(?<=[^\s\\])\$(?!\d)")
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]<>#+!|~])")


def inline_math_as_markdown(prose: str) -> str:
    """`prose` with each `$…$` replaced by its Unicode form in italics, escaped for Markdown."""
    return INLINE_MATH.sub(lambda m: "*" + _MARKDOWN_SPECIAL.sub(r"\\\1", tex_to_unicode(m.group(1))) + "*",
                           prose)
