"""A deterministic, offline training corpus: the local Python standard library's docstrings.

Every machine that can run this project has the standard library, so the corpus needs no
download. The documents come out in a fixed order (sorted paths, source order within a
file), so the same Python installation always yields the same corpus.
"""

from __future__ import annotations

import ast
import io
import random
import sysconfig
import tokenize
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.model.chat import EOT, render_chat

# Test suites are large, slow to parse and mostly docstring-free boilerplate; site-packages
# depends on what happens to be installed, which would make the corpus machine-specific.
_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test"})

_SYSTEM_PROMPT = "You are a helpful assistant that explains Python."
_QUESTIONS = (
    "What does {name} do?",
    "Explain the {kind} {name}.",
    "Describe {name} briefly.",
)

# The quote tune's rows (small-copy) and the extractive benchmark's prompts: an instruction
# to repeat a passage word for word; the answer is a space and the passage.
_QUOTE_PROMPT = "Repeat the following text exactly.\nText: {passage}\nRepeated:"
QUOTE_WORDS = (10, 60)  # shortest and longest passage a quote row repeats, in words


@dataclass(frozen=True)
class Docstring:
    """One docstring: its owner's kind ("module", "class", "function"), dotted name and text."""

    kind: str
    name: str
    text: str


def stdlib_python_files(root: Path | None = None) -> list[Path]:
    """Return the standard library's ``.py`` files, sorted, minus tests and site-packages."""
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    return sorted(
        path
        for path in base.rglob("*.py")
        if not _SKIPPED_DIRS.intersection(path.relative_to(base).parts[:-1])
    )


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) or path.stem


def _parse(path: Path) -> ast.Module | None:
    try:
        source = path.read_bytes()
        # Old stdlib modules contain invalid escape sequences. Under `-W error` the resulting
        # SyntaxWarning would become a SyntaxError and silently drop the file, so the corpus
        # (and the model) would depend on the caller's warning filters; ignore it here only.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            return ast.parse(source, filename=str(path))
    except (SyntaxError, ValueError, OSError, UnicodeDecodeError):
        return None  # e.g. lib2to3 test data written in Python 2: just skip it


def _walk(node: ast.AST, prefix: str) -> Iterator[Docstring]:
    """Yield docstrings of classes and functions below ``node`` in source order."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}.{child.name}"
            text = ast.get_docstring(child)
            if text:
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                yield Docstring(kind, name, text)
            yield from _walk(child, name)
        elif isinstance(child, (ast.If, ast.Try, ast.With)):
            # Definitions guarded by `if sys.platform ...` or `try: import` are still API.
            yield from _walk(child, prefix)


def iter_docstrings(root: Path | None = None) -> Iterator[Docstring]:
    """Yield every module, class and function docstring of the standard library, in order."""
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    for path in stdlib_python_files(base):
        tree = _parse(path)
        if tree is None:
            continue
        module = _module_name(path, base)
        text = ast.get_docstring(tree)
        if text:
            yield Docstring("module", module, text)
        yield from _walk(tree, module)


def iter_comment_passages(root: Path | None = None) -> Iterator[str]:
    """Yield the standard library's comment blocks (runs of whole-line ``#`` comments on
    consecutive lines), each joined into one line, in file order: English prose and code
    words that the corpus, made of docstrings alone, never holds."""
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    for path in stdlib_python_files(base):
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
        except (SyntaxError, tokenize.TokenError, ValueError, OSError, UnicodeDecodeError):
            continue
        block: list[str] = []
        last_line = -2
        for token in tokens:
            if token.type != tokenize.COMMENT or not token.line.lstrip().startswith("#"):
                continue
            text = token.string.lstrip("#").strip()
            if token.start[0] != last_line + 1 or not text:
                if block:
                    yield " ".join(block)
                block = []
            if text:
                block.append(text)
            last_line = token.start[0]
        if block:
            yield " ".join(block)


def quote_prompt(passage: str) -> str:
    """The instruction to repeat ``passage``, up to where its answer starts."""
    return _QUOTE_PROMPT.format(passage=passage)


def quote_answer(passage: str) -> str:
    """The answer to ``quote_prompt(passage)``, or its start for the start of a passage."""
    return f" {passage}"


def quote_passages(texts: Sequence[str], rng: random.Random, count: int) -> list[str]:
    """``count`` runs of ``QUOTE_WORDS`` consecutive words cut at random from ``texts``
    (those of enough words), their white space made single spaces."""
    shortest, longest = QUOTE_WORDS
    pool = [words for words in (text.split() for text in texts) if len(words) >= shortest]
    if not pool:
        raise ValueError(f"no text of {shortest} words to quote")
    passages = []
    for _ in range(count):
        words = rng.choice(pool)
        length = rng.randint(shortest, min(longest, len(words)))
        start = rng.randint(0, len(words) - length)
        passages.append(" ".join(words[start : start + length]))
    return passages


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def _chat_example(doc: Docstring, index: int) -> str | None:
    """Turn a public class or function docstring into a one-turn chat example.

    The answer is the docstring's first paragraph (its summary). This is what teaches the
    model the chat template and to end a reply with ``<|endoftext|>``.
    """
    if doc.kind == "module" or any(_is_private(part) for part in doc.name.split(".")):
        return None
    summary = doc.text.split("\n\n", 1)[0].strip()
    if len(summary) < 20:
        return None
    question = _QUESTIONS[index % len(_QUESTIONS)].format(name=doc.name, kind=doc.kind)
    messages = [{"role": "user", "content": question}]
    if index % 4 == 0:  # some examples carry a system prompt so that role is known too
        messages.insert(0, {"role": "system", "content": _SYSTEM_PROMPT})
    return render_chat(messages, add_generation_prompt=True) + summary + EOT


def build_corpus(max_bytes: int, root: Path | None = None) -> list[str]:
    """Return the training documents, at most about ``max_bytes`` of UTF-8 in total.

    Each docstring is one plain document; public classes and functions add a chat example.
    Documents do not end with ``<|endoftext|>`` (packing adds it) except chat examples, whose
    reply must end with it. Parsing stops once the cap is reached, so small caps are fast.
    """
    docs: list[str] = []
    total = 0
    chats = 0  # numbers the chat examples, to vary their question and system prompt
    for doc in iter_docstrings(root):
        chat = _chat_example(doc, chats)
        chats += chat is not None
        for text in (doc.text, chat):
            if text is None:
                continue
            size = len(text.encode("utf-8"))
            if total + size > max_bytes:
                return docs
            docs.append(text)
            total += size
    return docs
