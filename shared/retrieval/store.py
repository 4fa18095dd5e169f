"""Knowledge-base indexes on disk, versioned, shared by every process that reads them.

An index lives in a folder of the index directory (``TW_INDEX_DIR``; a path every edge
and batcher sees, a shared volume when they run on several machines)::

    <index dir>/<name>/CURRENT          the current version's name, replaced atomically
    <index dir>/<name>/<version>/       one immutable version:
        manifest.json                   embedder identity, kind, counts, docs, digests
        index.faiss                     the FAISS index (ids are passage ids)
        passages.jsonl                  {"id", "doc", "text"} per passage
        vectors.npy, ids.npy            the embeddings, to change the index without
                                        embedding unchanged passages again

A change (``build``, ``add``, ``remove``) writes a whole new version beside the current
one and then replaces ``CURRENT``: a reader sees the old version or the new one, never a
mix, and a reader that looks after the change returns has the new one. Writers take a
lock on the index, so two changes never lose one another. The two newest versions are
kept (a reader may still be loading the one before).

Files, not Redis: an index of a million passages is gigabytes (vectors, the FAISS
structure, the texts), more than a Redis instance should hold, and FAISS reads files.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import orjson

from shared.retrieval.vectors import IndexPlan, build, set_nprobe, tune_nprobe

FORMAT = 1
KEEP_VERSIONS = 2
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_VERIFIED = ("index.faiss", "passages.jsonl")  # checked at every load
_UPDATE_FILES = ("vectors.npy", "ids.npy")  # checked before a change reads them

Embed = Callable[[Sequence[str]], np.ndarray]


class RetrievalError(ValueError):
    """A retrieval request or index that cannot be served; ``code`` is stable."""

    code = "retrieval_error"


class UnknownIndex(RetrievalError):
    code = "unknown_index"


class NoIndexes(RetrievalError):
    code = "no_indexes"


class EmbedderMismatch(RetrievalError):
    code = "embedder_mismatch"


class CorruptIndex(RetrievalError):
    code = "corrupt_index"


@dataclass(frozen=True, slots=True)
class Passage:
    """One retrievable passage: its id in the index, its document, its text."""

    id: int
    doc: str
    text: str


@dataclass(slots=True)
class Manifest:
    """What a version holds and how it was made."""

    name: str
    version: str
    embedder: str
    dim: int
    kind: str
    nlist: int
    nprobe: int
    count: int
    next_id: int
    docs: dict[str, list[int]]
    digests: dict[str, str] = field(default_factory=dict)
    created_at: float = 0.0
    format: int = FORMAT

    @classmethod
    def parse(cls, raw: bytes, where: Path) -> Manifest:
        try:
            data = orjson.loads(raw)
            if data.get("format") != FORMAT:
                raise CorruptIndex(f"{where}: format {data.get('format')!r}, expected {FORMAT}")
            return cls(**data)
        except (orjson.JSONDecodeError, TypeError, AttributeError) as exc:
            raise CorruptIndex(f"{where}: unreadable manifest ({exc})") from None


@dataclass(slots=True)
class LoadedIndex:
    """One version in memory, ready to search."""

    manifest: Manifest
    index: Any
    passages: dict[int, Passage]

    def search(self, queries: np.ndarray, k: int) -> list[list[tuple[float, Passage]]]:
        """The ``k`` best passages of each query row, best first, with their cosines."""
        scores, ids = self.index.search(np.ascontiguousarray(queries, np.float32), k)
        return [
            [(float(s), self.passages[int(i)]) for s, i in zip(row_s, row_i, strict=True) if i >= 0]
            for row_s, row_i in zip(scores, ids, strict=True)
        ]


def check_name(name: str) -> str:
    if not name or len(name) > 64 or not set(name) <= NAME_CHARS or name.startswith("."):
        raise RetrievalError(f"index name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
    return name


class IndexStore:
    """The indexes under one directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # --- reading ----------------------------------------------------------------------
    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "CURRENT").is_file())

    def current_version(self, name: str) -> str:
        """The version a request served now retrieves from (changes with every update)."""
        check_name(name)
        try:
            return (self.root / name / "CURRENT").read_text().strip()
        except FileNotFoundError:
            if not self.names():
                raise NoIndexes(f"no retrieval indexes in {self.root}") from None
            raise UnknownIndex(
                f"no index named {name!r} (indexes: {', '.join(self.names())})"
            ) from None

    def manifest(self, name: str, version: str | None = None) -> Manifest:
        version = version or self.current_version(name)
        path = self.root / name / version / "manifest.json"
        try:
            return Manifest.parse(path.read_bytes(), path)
        except FileNotFoundError:
            raise CorruptIndex(f"{path} is missing") from None

    def load(self, name: str, version: str | None = None) -> LoadedIndex:
        """A version read and checked: a file that does not match its manifest's digest is
        refused (``CorruptIndex``) instead of being searched."""
        m = self.manifest(name, version)
        folder = self.root / name / m.version
        for fname in _VERIFIED:
            _verify(folder / fname, m.digests.get(fname))
        try:
            index = faiss.read_index(str(folder / "index.faiss"))
        except RuntimeError as exc:
            raise CorruptIndex(f"{folder / 'index.faiss'}: FAISS cannot read it ({exc})") from None
        set_nprobe(index, m.nprobe)
        passages = {p.id: p for p in _read_passages(folder / "passages.jsonl")}
        if index.ntotal != m.count or len(passages) != m.count or index.d != m.dim:
            raise CorruptIndex(f"{folder}: counts or dimensions disagree with the manifest")
        return LoadedIndex(m, index, passages)

    # --- changing ---------------------------------------------------------------------
    def build(
        self, name: str, docs: Mapping[str, list[str]], embed: Embed, embedder: str
    ) -> Manifest:
        """A new index of ``docs`` (document id → its passages), replacing any old one
        under this name (as a new version)."""
        with self._locked(check_name(name)):
            seq = self._next_seq(name)
            return self._write(name, seq, _State.empty(embedder), docs, [], embed)

    def add(
        self, name: str, docs: Mapping[str, list[str]], embed: Embed, embedder: str
    ) -> Manifest:
        """Add documents; a document already in the index is replaced by its new passages."""
        with self._locked(check_name(name)):
            state = self._state(name, embedder)
            return self._write(name, self._next_seq(name), state, docs, list(docs), embed)

    def remove(self, name: str, doc_ids: Sequence[str]) -> Manifest:
        """Remove documents (all their passages); unknown ids are an error."""
        with self._locked(check_name(name)):
            state = self._state(name, None)
            unknown = [d for d in doc_ids if d not in state.manifest.docs]
            if unknown:
                raise RetrievalError(f"index {name!r} has no document {', '.join(unknown)}")
            return self._write(name, self._next_seq(name), state, {}, list(doc_ids), embed=None)

    @contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / ".lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _next_seq(self, name: str) -> int:
        try:
            return int(self.current_version(name).split("-", 1)[0]) + 1
        except RetrievalError:
            return 1

    def _state(self, name: str, embedder: str | None) -> _State:
        loaded = self.load(name)
        m = loaded.manifest
        if embedder is not None and m.embedder != embedder:
            raise EmbedderMismatch(
                f"index {name!r} was built with embedder {m.embedder}; this one is {embedder}: "
                "rebuild it with `tokenwire index build`"
            )
        folder = self.root / name / m.version
        for fname in _UPDATE_FILES:
            _verify(folder / fname, m.digests.get(fname))
        vectors = np.load(folder / "vectors.npy")
        ids = np.load(folder / "ids.npy")
        return _State(m, loaded.index, vectors, ids, loaded.passages)

    def _write(
        self,
        name: str,
        seq: int,
        state: _State,
        docs: Mapping[str, list[str]],
        dropped: list[str],
        embed: Embed | None,
    ) -> Manifest:
        texts = [(doc, t) for doc, passages in docs.items() for t in passages]
        new_vectors = embed([t for _, t in texts]) if texts and embed else None
        nxt = state.apply(dropped, texts, new_vectors)
        version = f"{seq:06d}-{secrets.token_hex(4)}"
        folder = self.root / name
        tmp = folder / f".tmp-{version}"
        tmp.mkdir()
        faiss.write_index(nxt.index, str(tmp / "index.faiss"))
        np.save(tmp / "vectors.npy", nxt.vectors)
        np.save(tmp / "ids.npy", nxt.ids)
        with (tmp / "passages.jsonl").open("wb") as fh:
            for p in nxt.passages.values():
                fh.write(orjson.dumps(asdict(p)) + b"\n")
        m = nxt.manifest
        m.name, m.version, m.created_at = name, version, time.time()
        m.digests = {f: _digest(tmp / f) for f in (*_VERIFIED, *_UPDATE_FILES)}
        (tmp / "manifest.json").write_text(json.dumps(asdict(m), indent=1))
        os.rename(tmp, folder / version)
        current = folder / f".CURRENT-{version}"
        current.write_text(version + "\n")
        os.replace(current, folder / "CURRENT")
        self._prune(folder)
        return m

    def _prune(self, folder: Path) -> None:
        versions = sorted(p for p in folder.iterdir() if p.is_dir() and p.name[0].isdigit())
        for old in versions[:-KEEP_VERSIONS]:
            shutil.rmtree(old, ignore_errors=True)


@dataclass(slots=True)
class _State:
    """An index's contents while a change is computed."""

    manifest: Manifest
    index: Any
    vectors: np.ndarray
    ids: np.ndarray
    passages: dict[int, Passage]

    @classmethod
    def empty(cls, embedder: str) -> _State:
        m = Manifest("", "", embedder, 0, "flat", 0, 0, 0, 0, {})
        return cls(m, None, np.zeros((0, 0), np.float32), np.zeros(0, np.int64), {})

    def apply(
        self, dropped: list[str], texts: list[tuple[str, str]], vectors: np.ndarray | None
    ) -> _State:
        """The contents after removing the ``dropped`` documents and adding ``texts``."""
        m = self.manifest
        docs = {d: ids for d, ids in m.docs.items() if d not in dropped}
        gone = np.array([i for d in dropped for i in m.docs.get(d, [])], np.int64)
        keep = ~np.isin(self.ids, gone)
        new_ids = np.arange(m.next_id, m.next_id + len(texts), dtype=np.int64)
        passages = {i: p for i, p in self.passages.items() if p.doc not in dropped}
        for pid, (doc, text) in zip(new_ids.tolist(), texts, strict=True):
            passages[pid] = Passage(pid, doc, text)
            docs.setdefault(doc, []).append(pid)
        parts = [self.vectors[keep]] if self.vectors.size else []
        if vectors is not None:
            parts.append(vectors.astype(np.float32))
        if not parts:
            raise RetrievalError("an index needs at least one passage")
        all_vectors = np.ascontiguousarray(np.concatenate(parts))
        all_ids = np.concatenate([self.ids[keep], new_ids])
        index, plan = self._index_for(all_vectors, all_ids, gone, new_ids, vectors)
        nprobe = tune_nprobe(index, all_vectors, all_ids)
        dim = all_vectors.shape[1]
        nxt = Manifest(
            "", "", m.embedder, dim, plan.kind, plan.nlist, nprobe, len(all_ids),
            m.next_id + len(texts), docs,
        )  # fmt: skip
        return _State(nxt, index, all_vectors, all_ids, passages)

    def _index_for(
        self,
        vectors: np.ndarray,
        ids: np.ndarray,
        gone: np.ndarray,
        new_ids: np.ndarray,
        new_vectors: np.ndarray | None,
    ) -> tuple[Any, IndexPlan]:
        """An IVF index that still fits the size takes the change in place (its lists
        were trained on this knowledge base); anything else is built anew."""
        plan = IndexPlan.for_size(len(ids))
        m = self.manifest
        in_place = plan.kind == "ivf" == m.kind and m.nlist / 2 <= plan.nlist <= m.nlist * 2
        if not in_place:
            return build(vectors, ids, plan), plan
        index = self.index
        if gone.size:
            index.remove_ids(gone)
        if new_vectors is not None and len(new_ids):
            index.add_with_ids(np.ascontiguousarray(new_vectors, np.float32), new_ids)
        return index, IndexPlan("ivf", m.nlist)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _verify(path: Path, expected: str | None) -> None:
    if not path.is_file():
        raise CorruptIndex(f"{path} is missing")
    if expected is None or _digest(path) != expected:
        raise CorruptIndex(
            f"{path} does not match its manifest's digest (corrupt or truncated): rebuild the "
            "index with `tokenwire index build`"
        )


def _read_passages(path: Path) -> Iterator[Passage]:
    with path.open("rb") as fh:
        for line in fh:
            yield Passage(**orjson.loads(line))


def index_version(index_dir: str | Path, name: str) -> str:
    """The current version of index ``name``: it changes with every build, add and
    remove, so a key that includes it never serves what an older version grounded."""
    return IndexStore(index_dir).current_version(name)
