"""Every JSON Schema keyword has an answer: enforced while writing, rewritten so it can be, or checked after.

llguidance enforces most of JSON Schema while the reply is written and, in its lenient mode, ignores the
rest with a warning naming each keyword. A schema is never refused for a keyword: this module rewrites the
keywords it can express in what llguidance takes, and names the rest, which are checked on the finished
reply with the `jsonschema` package (a warning per violation: which keyword, at which path). KEYWORDS is the
table the docs and `--json-schema --help` print.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from dataclasses import dataclass

ENFORCED = "enforced while writing"
REWRITTEN = "rewritten, then enforced while writing"
CHECKED = "checked after the reply (a warning names each violation)"
ANNOTATION = "an annotation: nothing to enforce"

KEYWORDS: dict[str, str] = {
    **dict.fromkeys(["type", "properties", "required", "additionalProperties", "enum", "const", "items",
                     "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "minimum",
                     "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "anyOf", "oneOf",
                     "allOf", "$ref", "$defs", "definitions", "patternProperties", "minProperties",
                     "maxProperties"], ENFORCED),
    "format": ENFORCED + " (date-time, date, time, duration, email, hostname, ipv4, ipv6, uri, uuid and "
              "the other formats of JSON Schema 2020-12); an unknown one is named as not enforced",
    "uniqueItems": REWRITTEN + " when the items are an enum of at most 6 values (a choice of values in the "
                   "enum's order, each at most once); otherwise " + CHECKED.split(" (")[0],
    "dependentRequired": REWRITTEN + " (each dependency becomes: the property absent, or present with the "
                         "ones it requires)",
    "dependencies": REWRITTEN + " where a dependency lists property names; a schema dependency is "
                    + CHECKED.split(" (")[0],
    **dict.fromkeys(["contains", "minContains", "maxContains", "if", "then", "else", "not", "dependentSchemas",
                     "propertyNames", "unevaluatedProperties", "unevaluatedItems"], CHECKED),
    **dict.fromkeys(["title", "description", "default", "examples", "$comment", "$schema", "$id",
                     "readOnly", "writeOnly", "deprecated", "contentEncoding", "contentMediaType"], ANNOTATION),
}

UNIQUE_ENUM_LIMIT = 6  # an enum's subsets in order: 2**6 = 64 alternatives at most


@dataclass(frozen=True)
class PreparedSchema:
    """A schema as llguidance gets it, and what of the original it does not enforce."""
    schema: dict
    unenforced: tuple[str, ...]  # keywords (and "format: NAME") checked after the reply


@dataclass(frozen=True)
class SchemaWarning:
    keyword: str
    path: str  # JSONPath of the value, "$" for the whole reply
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message} (`{self.keyword}`, checked after the reply)"


def rewrite(schema: dict) -> dict:
    """`schema` with the rewritable keywords expressed in what llguidance enforces (a copy)."""
    return _rewrite(copy.deepcopy(schema))


def _rewrite(node):
    if isinstance(node, list):
        return [_rewrite(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _rewrite(value) for key, value in node.items()}
    node = _unique_enum_items(node)
    requires = dict(node.pop("dependentRequired", {}) or {})
    dependencies = node.get("dependencies")
    if isinstance(dependencies, dict):
        names = {k: v for k, v in dependencies.items() if isinstance(v, list)}
        requires.update(names)
        rest = {k: v for k, v in dependencies.items() if k not in names}
        if rest:
            node["dependencies"] = rest
        else:
            del node["dependencies"]
    if requires:
        node["allOf"] = list(node.get("allOf", [])) + [
            {"anyOf": [{"properties": {name: False}}, {"required": [name, *needed]}]}
            for name, needed in requires.items()]
    return node


def _unique_enum_items(node: dict) -> dict:
    items = node.get("items")
    values = items.get("enum") if isinstance(items, dict) and set(items) <= {"enum", "type"} else None
    if node.get("uniqueItems") is not True or not isinstance(values, list) or len(values) > UNIQUE_ENUM_LIMIT:
        return node
    low, high = node.get("minItems", 0), node.get("maxItems", len(values))
    choices = [{"type": "array", "prefixItems": [{"const": v} for v in subset], "items": False,
                "minItems": len(subset)}
               for n in range(low, min(high, len(values)) + 1) for subset in itertools.combinations(values, n)]
    kept = {k: v for k, v in node.items()
            if k not in ("items", "uniqueItems", "minItems", "maxItems", "type")}
    return {**kept, "anyOf": choices} if choices else node


_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \[(.*)\]')
_UNKNOWN_FORMAT = re.compile(r'Unknown format: (\S+)')


def unenforced(warnings: list[str]) -> tuple[str, ...]:
    """The keywords llguidance's lenient-mode warnings name."""
    found: set[str] = set()
    for warning in warnings:
        if m := _UNIMPLEMENTED.search(warning):
            found.update(json.loads(f"[{m.group(1)}]"))
        elif m := _UNKNOWN_FORMAT.search(warning):
            found.add(f"format: {m.group(1)}")
    return tuple(sorted(found))


def check_reply(schema: dict, text: str, keywords: tuple[str, ...]) -> list[SchemaWarning]:
    """The reply's violations of the keywords that were not enforced while it was written (the original
    schema's, so a rewrite's narrower choice never shows up here)."""
    if not keywords:
        return []
    import jsonschema  # only for schemas that need it

    try:
        value = json.loads(text)
    except ValueError:
        return []  # a reply cut off before its grammar finished (cancelled, context full)
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    checker = validator(schema, format_checker=validator.FORMAT_CHECKER)
    formats = {k.split(": ", 1)[1] for k in keywords if k.startswith("format: ")}
    warnings = []
    for error in checker.iter_errors(value):
        for leaf in _leaves(error):
            path = [str(p) for p in leaf.absolute_schema_path]
            keyword = next((k for k in path if k in keywords), None)
            if keyword is None and leaf.validator == "format" and leaf.validator_value in formats:
                keyword = f"format: {leaf.validator_value}"
            if keyword is not None:
                warnings.append(SchemaWarning(keyword, leaf.json_path, leaf.message))
    return warnings


def _leaves(error):
    """The innermost errors under one (an anyOf's branches report their own)."""
    if not error.context:
        yield error
        return
    for child in error.context:
        yield from _leaves(child)
