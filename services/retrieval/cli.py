"""``tokenwire index build|add|remove|list``: knowledge-base indexes from local text files.

Files are cut into passages (``shared.retrieval.chunking``), embedded in batches with the
serving embedder (``TW_EMBED_MODEL_DIR``), and written as a new version of the index under
``TW_INDEX_DIR``; edges and batchers that read the same folder serve the new version from
the next request on. A document's id is its path as given (a folder: each text file under
it); ``add`` of a document already indexed replaces its passages.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from shared.retrieval.chunking import MAX_CHARS, OVERLAP_CHARS, ChunkSpec, chunk_text
from shared.settings import CommonSettings

# The store (FAISS) is imported where a command runs, not to parse every command line.
if TYPE_CHECKING:
    from shared.embedding import Embedder
    from shared.retrieval.store import IndexStore, Manifest

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")


def read_documents(paths: list[str], spec: ChunkSpec) -> dict[str, list[str]]:
    """Document id → passages, for each file given and each text file under a folder."""
    from shared.retrieval.store import RetrievalError

    docs: dict[str, list[str]] = {}
    for given in paths:
        path = Path(given)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())
        elif path.is_file():
            files = [path]
        else:
            raise RetrievalError(f"{given}: no such file or folder")
        for f in files:
            passages = chunk_text(f.read_text(encoding="utf-8", errors="replace"), spec)
            if passages:
                docs[os.path.normpath(f)] = passages
    if not docs:
        raise RetrievalError("no text in the files given")
    return docs


def _store() -> tuple[IndexStore, CommonSettings]:
    from shared.retrieval.store import IndexStore

    settings = CommonSettings.from_env()
    return IndexStore(settings.index_root), settings


def _embedder(settings: CommonSettings) -> Embedder:
    from shared.embedding import load_embedder

    return load_embedder(settings.embed_model_dir or None, dtype=settings.embed_dtype)


def _report(verb: str, m: Manifest, started: float) -> None:
    tuned = f", nlist {m.nlist}, nprobe {m.nprobe}" if m.kind == "ivf" else ""
    print(
        f"index {m.name} {verb}: version {m.version}, {m.count} passages from {len(m.docs)} "
        f"documents ({m.kind}{tuned}) in {time.monotonic() - started:.1f} s"
    )


def _write(args: argparse.Namespace, verb: str, adding: bool) -> None:
    """Read and embed ``args.paths``, then build the index anew or add to it."""
    started = time.monotonic()
    store, settings = _store()
    if adding:
        store.current_version(args.name)  # an unknown index is refused before the embedder loads
    docs = read_documents(args.paths, ChunkSpec(args.max_chars, args.overlap))
    emb = _embedder(settings)
    write = store.add if adding else store.build
    _report(verb, write(args.name, docs, emb.embed, emb.identity), started)


def cmd_build(args: argparse.Namespace) -> None:
    _write(args, "built", adding=False)


def cmd_add(args: argparse.Namespace) -> None:
    _write(args, "updated", adding=True)


def cmd_remove(args: argparse.Namespace) -> None:
    started = time.monotonic()
    store = _store()[0]
    _report("updated", store.remove(args.name, [os.path.normpath(d) for d in args.docs]), started)


def cmd_list(_: argparse.Namespace) -> None:
    store = _store()[0]
    names = store.names()
    if not names:
        print(f"no indexes in {store.root}")
    for name in names:
        m = store.manifest(name)
        print(f"{name}\t{m.version}\t{m.count} passages\t{len(m.docs)} documents\t{m.kind}")


def run(args: argparse.Namespace) -> None:
    """Run an ``index`` subcommand; a retrieval or embedder error exits with its message."""
    from shared.embedding import EmbedderError
    from shared.retrieval.store import RetrievalError

    try:
        args.index_fn(args)
    except (RetrievalError, EmbedderError, ValueError) as exc:
        sys.exit(f"tokenwire index: {exc}")


def add_parser(sub: Subparsers) -> None:
    ix = sub.add_parser(
        "index",
        help="retrieval indexes: build, add, remove, list",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    isub = ix.add_subparsers(dest="index", required=True)
    b = isub.add_parser("build", help="index text files as NAME (a new version replaces any)")
    a = isub.add_parser("add", help="add files to NAME; a file already indexed is replaced")
    for p, fn in ((b, cmd_build), (a, cmd_add)):
        p.add_argument("name", help="the index name (letters, digits, '.', '_', '-')")
        p.add_argument("paths", nargs="+", help="text files, or folders of .txt/.md/.rst files")
        p.add_argument(
            "--max-chars",
            type=int,
            default=MAX_CHARS,
            help=f"longest passage in characters (default: {MAX_CHARS})",
        )
        p.add_argument(
            "--overlap",
            type=int,
            default=OVERLAP_CHARS,
            help=f"characters a passage shares with the next (default: {OVERLAP_CHARS})",
        )
        p.set_defaults(fn=run, index_fn=fn)
    r = isub.add_parser("remove", help="remove documents (by the path they were added as)")
    r.add_argument("name", help="the index name")
    r.add_argument("docs", nargs="+", help="document ids, as `index add` was given them")
    r.set_defaults(fn=run, index_fn=cmd_remove)
    ls = isub.add_parser("list", help="the indexes, their versions and sizes")
    ls.set_defaults(fn=run, index_fn=cmd_list)
