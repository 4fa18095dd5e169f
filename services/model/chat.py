"""The chat format shared by the tokenizer's Jinja template and the training corpus.

A conversation renders as ``<|system|>\\n...\\n<|user|>\\n...\\n<|assistant|>\\n``. The role
markers are special tokens (one id each, never split or merged by BPE), and the trained
models end an assistant reply with ``<|endoftext|>`` because the corpus teaches them to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

EOT = "<|endoftext|>"
SYSTEM = "<|system|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"

# Roles accepted by the template and the marker each one renders as. "developer" is the
# OpenAI name for a system message, so clients speaking that dialect work unchanged.
ROLE_MARKERS: dict[str, str] = {
    "system": SYSTEM,
    "developer": SYSTEM,
    "user": USER,
    "assistant": ASSISTANT,
}

# Each marker is a string literal in the template (not built as '<|' + role + '|>') so that
# transformers' `sanitize_control_tokens=True` can recognise them as the control tokens.
# Tools (OpenAI's ``tools``) render as a system block listing each function's definition;
# a call is answered as the compact JSON the edge constrains calls to, and a tool's result
# is a system message. Conversations without tools render as before (the corpus's format).
CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{ '<|system|>\n' }}"
    "{{ 'You may call these functions. To call one, answer only with '"
    ' ~ \'{"name": <function name>, "arguments": <arguments object>}.\n\' }}'
    "{%- for tool in tools -%}"
    "{{ (tool['function'] if tool['function'] is defined else tool) | tojson ~ '\n' }}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' or message['role'] == 'developer' -%}"
    "{{ '<|system|>\n' }}"
    "{%- elif message['role'] == 'user' -%}"
    "{{ '<|user|>\n' }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{ '<|assistant|>\n' }}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{ '<|system|>\n' }}{{ 'Result of ' ~ message['tool_call_id'] ~ ': ' }}"
    "{%- else -%}"
    "{{ raise_exception('unsupported chat role: ' ~ message['role']) }}"
    "{%- endif -%}"
    "{{ (message['content'] or '') }}"
    "{%- for call in (message['tool_calls'] or []) -%}"
    "{{ '{\"name\": \"' ~ call['function']['name'] ~ '\", \"arguments\": '"
    " ~ call['function']['arguments'] ~ '}' }}"
    "{%- endfor -%}"
    "{{ '\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|assistant|>\n' }}"
    "{%- endif -%}"
)


def render_chat(messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool) -> str:
    """Render ``messages`` exactly as :data:`CHAT_TEMPLATE` does, without Jinja.

    Used to write the chat examples of the training corpus, so that the model sees the very
    format the serving path produces; the unit test checks the two agree.
    """
    parts: list[str] = []
    for message in messages:
        role = message["role"]
        if role not in ROLE_MARKERS:
            raise ValueError(f"unsupported chat role: {role}")
        parts.append(f"{ROLE_MARKERS[role]}\n{message['content']}\n")
    if add_generation_prompt:
        parts.append(f"{ASSISTANT}\n")
    return "".join(parts)
