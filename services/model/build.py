"""Build (once) and locate the embedded default model: :func:`ensure_model`.

A build is deterministic: the corpus is the local standard library's docstrings, the
tokenizer and weights are seeded, and training runs a fixed number of steps. The result is a
plain Hugging Face folder (``config.json``, ``model.safetensors``, ``tokenizer.json``, ...)
loadable with ``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained``, plus
``build_info.json`` describing how it was made.

Heavy imports (torch, transformers) happen only when a build actually runs, so asking for an
already built model is cheap.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from services.model.presets import ModelPreset, get_preset

# Bump whenever the recipe (corpus, tokenizer, architecture, training) changes: the folder
# name includes it, so existing caches are rebuilt instead of silently reused.
BUILD_VERSION = "1"

INFO_FILE = "build_info.json"
SAMPLE_PROMPT = "The function returns"
SAMPLE_QUESTION = "What does json.dumps do?"


def model_dir_name(preset: str) -> str:
    """Folder name (inside the cache dir) of ``preset`` built by this BUILD_VERSION."""
    return f"{preset}-v{BUILD_VERSION}"


def default_cache_dir() -> Path:
    """``$TOKENWIRE_CACHE/models``, defaulting to ``~/.cache/tokenwire/models``."""
    root = os.environ.get("TOKENWIRE_CACHE") or Path.home() / ".cache" / "tokenwire"
    return Path(root) / "models"


def recipe(spec: ModelPreset) -> dict[str, Any]:
    """What of ``spec``'s recipe a build records, beyond its sizes, to be matched before
    the build is reused: its step counts and, for a distilled preset, its teacher's
    recipe (a draft distilled from another build of the teacher guesses for that one), for
    a tune its base's."""
    fields: dict[str, Any] = {
        "train_steps": spec.train_steps,
        "copy_step_limit": spec.copy_steps,
        "tune_steps": spec.tune_steps,
    }
    if spec.distill_from:
        fields["teacher"] = recipe(get_preset(spec.distill_from))
    elif spec.init_from:  # a tune of that build
        fields["base"] = recipe(get_preset(spec.init_from))
    return fields


def is_ready(folder: Path, spec: ModelPreset | None = None) -> bool:
    """Whether ``folder`` holds a finished build (its info file is written last), of
    ``spec``'s sizes and recipe when given: a preset whose sizes or recipe changed is
    built again."""
    if not (folder / INFO_FILE).is_file():
        return False
    if spec is None:
        return True
    return _has_sizes(folder, spec) and _matches(read_build_info(folder), recipe(spec))


def _has_sizes(folder: Path, spec: ModelPreset) -> bool:
    """Whether the model config in ``folder`` has ``spec``'s widths, depth, vocabulary and
    context."""
    try:
        with (folder / "config.json").open(encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return False
    sizes = {
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_positions,
    }
    return all(config.get(key) == value for key, value in sizes.items())


# Recipe fields that builds from before them lack, with the value those builds had.
_NEWER_FIELDS = {"copy_step_limit": 0, "tune_steps": 0}


def _matches(info: dict[str, Any], fields: dict[str, Any]) -> bool:
    """Whether a build's recorded ``info`` has the recipe ``fields`` (nested: a teacher's)."""
    for key, value in fields.items():
        had = info.get(key, _NEWER_FIELDS.get(key))
        if isinstance(value, dict):
            if not (isinstance(had, dict) and _matches(had, value)):
                return False
        elif had != value:
            return False
    return True


def read_build_info(folder: Path) -> dict[str, Any]:
    """Return the ``build_info.json`` of a finished build."""
    with (folder / INFO_FILE).open(encoding="utf-8") as handle:
        info: dict[str, Any] = json.load(handle)
    return info


def ensure_model(
    preset: str,
    cache_dir: Path,
    *,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> Path:
    """Return the folder of a ready model for ``preset``, building it only when missing.

    The build goes to a temporary folder next to the final one and is renamed into place at
    the end, so an interrupted build never leaves a half-written model behind. A lock file
    serialises concurrent callers (several processes starting at once build only once).
    ``force=True`` rebuilds even if a finished build exists.
    """
    spec = get_preset(preset)
    cache_dir = Path(cache_dir)
    name = model_dir_name(spec.name)
    final = cache_dir / name
    if not force and is_ready(final, spec):
        log(f"[model] {spec.name}: using {final}")
        refresh_chat_template(final)
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(cache_dir / f".{name}.lock"):
        if not force and is_ready(final, spec):  # another process finished it while we waited
            log(f"[model] {spec.name}: using {final} (built by another process)")
            return final
        _remove_leftovers(cache_dir, name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache_dir))
        try:
            log(f"[model] {spec.name}: building into {final} (recipe v{BUILD_VERSION})")
            build_model(spec, tmp, log=log, cache_dir=cache_dir)
            tmp.chmod(0o755)  # mkdtemp makes it private; a model folder is ordinary data
            _install(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def refresh_chat_template(folder: Path) -> None:
    """Give a finished build the current chat template. Training sees only the plain
    conversations ``render_chat`` writes, which the template renders unchanged, so a
    template that grew (tools, tool results) applies to existing builds without
    retraining them. Written atomically: readers see the old file or the new one."""
    from services.model.chat import CHAT_TEMPLATE

    path = folder / "chat_template.jinja"
    if not path.is_file() or path.read_text(encoding="utf-8") == CHAT_TEMPLATE:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(CHAT_TEMPLATE, encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    # flock is released by the kernel if the process dies, so a crash never wedges builds.
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_leftovers(cache_dir: Path, name: str) -> None:
    # Only called under the lock, so any temp folder found belongs to a dead build.
    for pattern in (f".{name}.tmp-*", f".{name}.old-*"):
        for leftover in sorted(cache_dir.glob(pattern)):
            shutil.rmtree(leftover, ignore_errors=True)


def _install(tmp: Path, final: Path) -> None:
    """Move the finished build into place, replacing (with ``force``) an older one."""
    if final.exists():
        # os.replace cannot overwrite a non-empty directory: move the old one aside first.
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def build_model(
    spec: ModelPreset,
    out_dir: Path,
    *,
    log: Callable[[str], None] = print,
    cache_dir: Path | None = None,
) -> dict[str, Any]:
    """Run the whole recipe for ``spec`` and write the model into ``out_dir``; a distilled
    preset's teacher and starting weights come from (or are built into) ``cache_dir``.

    Returns the build info (also written to ``build_info.json``, last): sizes, timings,
    final loss and sample generations. The caller's torch RNG state is left untouched.
    """
    import torch  # imported here: it costs seconds, and only a build needs it

    # The recipe seeds torch's global RNG; fork it so a server calling this is unaffected.
    with torch.random.fork_rng(devices=[]):
        return _build(spec, out_dir, log, Path(cache_dir or default_cache_dir()))


def _build(
    spec: ModelPreset, out_dir: Path, log: Callable[[str], None], cache_dir: Path
) -> dict[str, Any]:
    from services.model.corpus import build_corpus
    from services.model.train import make_model, pack_documents, parameter_count, take_weights

    started = time.perf_counter()
    timings: dict[str, float] = {}

    mark = time.perf_counter()
    docs = build_corpus(spec.corpus_bytes)
    corpus_bytes = sum(len(doc.encode("utf-8")) for doc in docs)
    timings["corpus_s"] = time.perf_counter() - mark
    log(f"[model] {spec.name}: corpus {len(docs)} documents, {corpus_bytes / 1e6:.2f} MB")

    mark = time.perf_counter()
    backend, tokenizer = _tokenizer(spec, docs)
    eot_id = tokenizer.eos_token_id
    timings["tokenizer_s"] = time.perf_counter() - mark
    log(f"[model] {spec.name}: tokenizer {backend.get_vocab_size()} tokens")

    model = make_model(spec, eot_id)
    params = parameter_count(model)
    log(f"[model] {spec.name}: {params:,} parameters")

    info: dict[str, Any] = {
        "preset": spec.name,
        "build_version": BUILD_VERSION,
        "parameters": params,
        "tokenizer_vocab": backend.get_vocab_size(),
        "corpus_docs": len(docs),
        "corpus_bytes": corpus_bytes,
        **recipe(spec),
    }
    if spec.copy_steps:
        info.update(_copy_phase(spec, model, eot_id, log, timings))
    teacher = None
    if spec.distill_from:
        teacher = _relative(spec.distill_from, tokenizer, cache_dir, log)
    if spec.init_from:
        take_weights(_relative(spec.init_from, tokenizer, cache_dir, log), model)
    if spec.distill_from or spec.init_from:
        info.update(
            distilled_from=spec.distill_from or None, initialized_from=spec.init_from or None
        )
    data = None
    if not spec.random_weights:
        mark = time.perf_counter()
        data = pack_documents(docs, backend, spec.seq_len, eot_id)
        timings["pack_s"] = time.perf_counter() - mark
        info["corpus_tokens"] = data.numel()
    if spec.trained:
        info.update(_train(spec, model, data, log, timings, teacher))
    if spec.tune_steps:
        info.update(_tune(spec, model, data, docs, backend, eot_id, log, timings))

    if not spec.random_weights:  # a random model's samples say nothing
        mark = time.perf_counter()
        info["samples"] = _samples(model, tokenizer, spec.seed)
        timings["sample_s"] = time.perf_counter() - mark
        for kind, text in info["samples"].items():
            log(f"[model] {spec.name}: {kind}: {text!r}")

    _save(model, tokenizer, out_dir)
    timings["total_s"] = time.perf_counter() - started
    info["timings"] = {key: round(value, 2) for key, value in timings.items()}
    info["versions"] = _versions()
    # Written last: its presence is what marks the folder as a finished build.
    (out_dir / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    log(f"[model] {spec.name}: built in {timings['total_s']:.1f}s")
    return info


def _tokenizer(spec: ModelPreset, docs: list[str]) -> tuple[Any, Any]:
    """The trained tokenizer backend and its Hugging Face wrapper (with an EOS token)."""
    from services.model.tokenizer import train_tokenizer, wrap_tokenizer

    backend = train_tokenizer(docs, spec.vocab_size)
    if backend.get_vocab_size() > spec.vocab_size:  # the trainer treats it as an upper bound
        raise RuntimeError(f"tokenizer has {backend.get_vocab_size()} > {spec.vocab_size} tokens")
    tokenizer = wrap_tokenizer(backend, spec.max_positions)
    assert tokenizer.eos_token_id is not None
    return backend, tokenizer


def _relative(name: str, tokenizer: Any, cache_dir: Path, log: Callable[[str], None]) -> Any:
    """Preset ``name``'s model (built if missing), which must share ``tokenizer``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ensure_model(name, cache_dir, log=log)
    if AutoTokenizer.from_pretrained(folder).get_vocab() != tokenizer.get_vocab():
        raise RuntimeError(f"{name} ({folder}) has another tokenizer than this build")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32")
    return model.eval()


def _copy_phase(
    spec: ModelPreset,
    model: Any,
    eot_id: int,
    log: Callable[[str], None],
    timings: dict[str, float],
) -> dict[str, Any]:
    """Teach a shallow model of ``spec``'s widths to copy, then graft it into ``model``."""
    from dataclasses import replace

    from services.model.train import COPY_DONE, available_cpus, graft, make_model, train_copy

    shallow = make_model(
        replace(spec, num_layers=spec.copy_layers, copy_steps=0, tune_steps=0), eot_id
    )
    threads = available_cpus()
    log(
        f"[model] {spec.name}: copy phase, {spec.copy_layers} layers, at most "
        f"{spec.copy_steps} steps, {threads} threads"
    )
    result = train_copy(shallow, spec, log, threads=threads)
    graft(shallow, model)
    timings["copy_s"] = result.seconds
    copied = result.final_copied or 0.0
    log(f"[model] {spec.name}: copy phase done in {len(result.losses)} steps, {copied:.0%} copied")
    if copied < COPY_DONE:
        log(
            f"[model] {spec.name}: warning: copying did not form within {spec.copy_steps} "
            "steps; the model will copy little (n-gram speculation gains little on it)"
        )
    return {
        "copy_steps": len(result.losses),
        "copy_final_loss": result.final_loss,
        "copied": copied,
    }


def _train(
    spec: ModelPreset,
    model: Any,
    data: Any,
    log: Callable[[str], None],
    timings: dict[str, float],
    teacher: Any = None,
) -> dict[str, Any]:
    """Train ``model`` on the packed corpus ``data`` (on ``teacher``'s distributions, when
    given); the build info's training fields."""
    from services.model.train import COPY_KEEP_ROWS, available_cpus, train

    threads = available_cpus()
    log(
        f"[model] {spec.name}: training {spec.train_steps} steps on {data.numel():,} tokens, "
        f"batch {spec.batch_size}x{spec.seq_len}, {threads} threads"
    )
    copy_rows = COPY_KEEP_ROWS if spec.copy_steps else 0
    result = train(model, data, spec, log, threads=threads, teacher=teacher, copy_rows=copy_rows)
    timings["train_s"] = result.seconds
    log(f"[model] {spec.name}: final loss {result.final_loss:.3f} in {result.seconds:.1f}s")
    info: dict[str, Any] = {
        "train_threads": threads,
        "first_loss": result.losses[0],
        "final_loss": result.final_loss,
    }
    if result.copied:
        info["copied_after_training"] = result.final_copied
    return info


def _tune(
    spec: ModelPreset,
    model: Any,
    data: Any,
    docs: list[str],
    backend: Any,
    eot_id: int,
    log: Callable[[str], None],
    timings: dict[str, float],
) -> dict[str, Any]:
    """Tune ``model`` to quote passages of the corpus when asked; the build info's tune
    fields."""
    from services.model.chat import EOT
    from services.model.corpus import quote_answer, quote_passages, quote_prompt
    from services.model.train import TUNE_ROWS, quote_rows, train_tune

    # Passages of the docstrings alone (``build_corpus`` ends each chat example with EOT).
    plain = [doc for doc in docs if not doc.endswith(EOT)]
    passages = quote_passages(plain, random.Random(spec.seed), spec.tune_steps * TUNE_ROWS)
    quotes = quote_rows(
        [quote_prompt(p) for p in passages], [quote_answer(p) for p in passages], backend, eot_id
    )
    log(f"[model] {spec.name}: quote tune, {spec.tune_steps} steps, {len(quotes)} passages")
    tuned = train_tune(model, data, quotes, spec, log)
    timings["tune_s"] = tuned.seconds
    log(
        f"[model] {spec.name}: tune done, loss {tuned.final_loss:.3f}, "
        f"{tuned.final_copied or 0:.0%} of its answers' tokens right"
    )
    return {"tune_final_loss": tuned.final_loss, "copied_after_tune": tuned.final_copied}


def _save(model: Any, tokenizer: Any, out_dir: Path) -> None:
    with _quiet_progress_bars():
        model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    for path in out_dir.iterdir():
        path.chmod(0o644)  # the safetensors file is written owner-only; it is not a secret


def _versions() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }


@contextlib.contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    """Hide transformers' "Writing model shards" bar (it would garble the build log)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _samples(model: Any, tokenizer: Any, seed: int, max_new_tokens: int = 32) -> dict[str, str]:
    """Greedy, sampled and chat continuations, recorded so a build's quality is visible."""
    import torch

    def run(prompt_ids: Any, **options: Any) -> str:
        with torch.no_grad():
            out = model.generate(**prompt_ids, max_new_tokens=max_new_tokens, **options)
        new = out[0, prompt_ids["input_ids"].shape[1] :]
        return str(tokenizer.decode(new, skip_special_tokens=True))

    plain = tokenizer(SAMPLE_PROMPT, return_tensors="pt")
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": SAMPLE_QUESTION}],
        add_generation_prompt=True,
        return_tensors="pt",
    )  # transformers 5 returns a BatchEncoding (dict) here by default
    greedy = SAMPLE_PROMPT + run(plain, do_sample=False)
    torch.manual_seed(seed)
    sampled = SAMPLE_PROMPT + run(plain, do_sample=True, temperature=0.8, top_k=40)
    return {"greedy": greedy, "sampled": sampled, "chat": run(chat, do_sample=False)}
