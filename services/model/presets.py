"""Named model recipes: architecture sizes plus how long (in steps) to train.

Training length is a fixed step count, never a wall-clock cut-off, so a build is a pure
function of its preset (and the local Python's standard library, which is the corpus).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelPreset:
    """Everything that determines one model build.

    No training and no tune (``random_weights``) leaves the weights random (a benchmark
    model); a tune alone starts from the weights of ``init_from``. ``train_seconds`` is the
    wall time the step count was sized for on a 2-core CPU; it is informational.
    """

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    train_steps: int = 0
    train_seconds: float = 0.0
    batch_size: int = 16
    seq_len: int = 128
    learning_rate: float = 3e-3
    warmup_steps: int = 10
    # Upper bound on the docstring corpus (UTF-8 bytes): small for `micro` so the unit
    # test only parses a handful of stdlib files.
    corpus_bytes: int = 3_000_000
    seed: int = 1234
    description: str = ""
    # Distillation: learn the next-token distributions of the preset ``distill_from`` (its
    # teacher, same tokenizer) instead of the corpus' tokens, starting from the weights of
    # the preset ``init_from`` (same widths; its first layers where this preset has fewer)
    # or from random ones. Both are built if missing.
    # A preset with ``init_from`` and a tune alone tunes that build (``tune_steps``).
    distill_from: str = ""
    init_from: str = ""
    # Copying first: a model of these widths and ``copy_layers`` layers learns to continue
    # a repeated run of tokens (at most ``copy_steps`` steps, ``train.train_copy``), and
    # becomes the first layers of this one before the corpus (``train.graft``).
    copy_steps: int = 0
    copy_layers: int = 2
    # Last, ``tune_steps`` steps of corpus rows with quote rows beside them (an instruction
    # to repeat a passage of the corpus, and the passage: ``train.train_tune``), so that
    # the model, asked to copy, copies real words.
    tune_steps: int = 0

    def __post_init__(self) -> None:
        # Fail at import time rather than deep inside LlamaConfig.
        if self.hidden_size % self.num_heads:
            raise ValueError(f"{self.name}: hidden_size must be a multiple of num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_heads must be a multiple of num_kv_heads")
        if self.train_steps and self.warmup_steps >= self.train_steps:
            raise ValueError(f"{self.name}: warmup_steps must be below train_steps")
        if self.init_from and not (self.distill_from or self.tune_steps):
            raise ValueError(f"{self.name}: init_from is for distillation or a tune")
        if self.distill_from and not self.train_steps:
            raise ValueError(f"{self.name}: distillation needs train_steps")
        if self.copy_steps and not 0 < self.copy_layers < self.num_layers:
            raise ValueError(f"{self.name}: copy_layers must be fewer than num_layers")
        if self.copy_steps and (self.init_from or not self.train_steps):
            raise ValueError(f"{self.name}: a copy phase comes before training from scratch")
        if self.tune_steps and not (self.copy_steps or self.init_from):
            raise ValueError(f"{self.name}: a tune needs a copy phase, here or in init_from")

    @property
    def parameter_count(self) -> int:
        """Parameters of the Llama model this preset builds (tied embeddings counted once)."""
        head_dim = self.hidden_size // self.num_heads
        attention = self.hidden_size * head_dim * 2 * (self.num_heads + self.num_kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size  # gate, up, down projections
        per_layer = attention + mlp + 2 * self.hidden_size  # + two RMSNorm weights
        return self.vocab_size * self.hidden_size + self.num_layers * per_layer + self.hidden_size

    @property
    def trained(self) -> bool:
        """Whether the build runs a training loop over the corpus (``train_steps``)."""
        return self.train_steps > 0

    @property
    def random_weights(self) -> bool:
        """Whether the build leaves its weights random: no training and no tune."""
        return not (self.trained or self.tune_steps)


_TINY = ModelPreset(
    name="tiny",
    hidden_size=128,
    num_layers=6,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=384,
    vocab_size=4096,
    max_positions=2048,
    train_steps=350,
    train_seconds=120.0,
    batch_size=16,
    seq_len=128,
    warmup_steps=20,
    description="default demo model: ~1.7M parameters, trained ~2 min on CPU",
)

_SMALL = ModelPreset(
    name="small",
    hidden_size=512,
    num_layers=10,
    num_heads=8,
    num_kv_heads=2,
    intermediate_size=1408,
    vocab_size=4096,
    max_positions=2048,
    train_steps=600,
    train_seconds=2000.0,  # the corpus with its copy rows; the copy phase ~1,300 more
    batch_size=16,
    seq_len=128,
    learning_rate=2e-3,
    warmup_steps=30,
    copy_steps=4000,
    description="benchmarks and speculation's target: ~30M parameters, a copy phase "
    "then ~35 min on CPU from tiny's corpus and tokenizer (built only when asked for)",
)

PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            name="micro",
            hidden_size=64,
            num_layers=4,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=192,
            vocab_size=1024,
            max_positions=512,
            train_steps=20,
            train_seconds=3.0,
            batch_size=8,
            seq_len=64,
            warmup_steps=4,
            corpus_bytes=200_000,
            description="unit tests: a few hundred K parameters, builds in seconds",
        ),
        _TINY,
        _SMALL,
        replace(
            _SMALL,
            name="small-copy",
            train_steps=0,
            train_seconds=1250.0,
            copy_steps=0,
            init_from="small",
            tune_steps=400,
            description="small tuned 400 steps more to repeat a passage when asked: n-gram "
            "speculation's model (built only when asked for, ~20 min)",
        ),
        ModelPreset(
            name="llama-1b",
            hidden_size=2048,
            num_layers=22,
            num_heads=32,
            num_kv_heads=4,
            intermediate_size=5632,
            vocab_size=4096,
            max_positions=2048,
            description="a GPU's bandwidth check: ~1.0B parameters in a 1B Llama's layer "
            "shapes, random weights (never trained; built only when asked for)",
        ),
        replace(
            _TINY,
            name="small-draft",
            num_layers=3,
            train_steps=400,
            train_seconds=480.0,
            learning_rate=2e-3,
            distill_from="small",
            init_from="tiny",
            description="speculation's draft for small: tiny's widths and first three "
            "layers, trained ~8 min more on small's next-token distributions over the corpus "
            "(built only when asked for, with small)",
        ),
    )
}


def get_preset(name: str) -> ModelPreset:
    """Return the preset called ``name`` or raise ``KeyError`` listing the valid names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}") from None
