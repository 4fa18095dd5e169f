"""Structured output at the edge: ``response_format`` and ``tools``/``tool_choice`` as
OpenAI clients send them, turned into the grammar the worker decodes under
(``shared.messages.Structure``), and a tool call read back out of the generated text.

A tool call is generated as one compact JSON object, ``{"name": "<function>",
"arguments": {...}}`` (the name first, from the declared ones; the arguments valid
against that function's parameters schema). ``required`` and a named function force it;
``auto`` is the grammar ``text | tool_call`` in which text is anything not starting with
``{``: the first token decides, so a call is recognised from its first character while
streaming, and no trigger string has to be taught to the model (structural tags would need
one the model emits before a call). Every spec is compiled here once (xgrammar, without
the vocabulary: milliseconds), so a schema xgrammar cannot compile is a 400 naming the
parameter, never an error later on.
"""

from __future__ import annotations

import json
import re
from typing import Any

from shared.messages import Structure

FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"

# Free text that cannot be mistaken for a call (xgrammar's EBNF).
_TEXT_RULE = "root ::= [^{] [^]*"

# The head of a generated call: compact JSON puts the name first, then the arguments.
CALL_HEAD = re.compile(r'^\{"name": "([A-Za-z0-9_-]{1,64})", "arguments": ')


def check_structure(structure: Structure) -> Structure:
    """``structure`` if xgrammar compiles it, else ``ValueError`` with its reason."""
    from services.worker.engine.grammar import GrammarError, grammar_of

    try:
        grammar_of(structure.kind, structure.spec)
    except GrammarError as exc:
        raise ValueError(f"the schema cannot be used for constrained decoding: {exc}") from None
    return structure


def _schema_spec(schema: dict[str, Any]) -> str:
    return json.dumps(schema, ensure_ascii=False)


def call_schema(functions: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The JSON schema of one call of any of ``functions`` ((name, parameters) pairs)."""
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": params or _NO_ARGUMENTS},
            "required": ["name", "arguments"],
        }
        for name, params in functions
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}


def text_or_call(call: dict[str, Any]) -> Structure:
    """``auto``: free text not starting with ``{``, or one call."""
    import xgrammar as xgr

    text = xgr.Grammar.from_ebnf(_TEXT_RULE)
    grammar = xgr.Grammar.from_json_schema(call, any_whitespace=False)
    return Structure(kind="ebnf", spec=str(xgr.Grammar.union(text, grammar)))


def forced_call(call: dict[str, Any]) -> Structure:
    return Structure(kind="json_schema", spec=_schema_spec(call))


def call_id(request_id: str, index: int = 0) -> str:
    """The id of the tool call of a response's choice ``index``: the same from every edge
    and on a resume."""
    base = "call_" + request_id.rsplit("-", 1)[-1][-24:]
    return base if index == 0 else f"{base}_{index}"


def split_call(text: str) -> tuple[str, str] | None:
    """``(name, arguments)`` of a complete generated call (the arguments as generated: a
    JSON text), or None when ``text`` is not one."""
    head = CALL_HEAD.match(text)
    if head is None or not text.endswith("}"):
        return None
    arguments = text[head.end() : -1]
    try:
        json.loads(arguments)
    except ValueError:
        return None
    return head.group(1), arguments
