"""Decode steps of a plain Llama-family model run on its weights directly.

On a small model a decode step's time is mostly Python, not arithmetic: transformers' Llama
forward makes about 85 module calls a token, through decorators, keyword merging and
output records, around a few dozen small kernels (tiny preset, one request, one thread:
about 40% of the model's time). For the models listed in ``DIRECT``, the runner runs its
decode steps here instead: the same torch operations, in the same order, on the same
weights, so the logits are bit-identical, without the modules around them. The runner
takes this path only after checking at load that it reproduces the model's own logits
bit for bit (``DirectDecoder.matches``), so a transformers release that changes the
forward falls back to it rather than serve other tokens. Prefill chunks, which carry
more arithmetic per call, always go through the model's own forward.

On a CPU a matrix product's time does not grow with its rows: with MKL on an AMD EPYC,
the linear layers of the ``small`` preset took about 11 ms for one row, 13 to 17 ms for
two to four, and 10 to 12 ms for five or six (the one-row product is a matrix-vector one,
a few rows take a slower kernel). ``tune_padding`` times the model's own products at one to
six rows when the decoder is built and pads a product to more rows wherever that is
faster by a clear margin; the padding rows are zeros and their outputs are dropped. A
row's logits in a padded product round as in a product of that many rows, as they already
differ in the last bits with the batch's size; the load probe compares unpadded products,
so it still checks the model's arithmetic bit for bit.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

# Model classes whose decoder layer is exactly: RMSNorm, q/k/v projections, rotary
# embedding, SDPA over the cache, output projection, residual; RMSNorm, SiLU-gated MLP,
# residual.
DIRECT = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"})
# Rotary types whose inverse frequencies are fixed at load (dynamic ones change them).
STATIC_ROPE = frozenset({"default", "linear", "llama3", "yarn"})
# Products of up to this many rows are timed at load (``tune_padding``), and a product is
# padded only where the padded one took at most ``PAD_GAIN`` of its time.
PAD_ROWS = 6
PAD_GAIN = 0.85
# Weights the timing cycles through, at most: enough to leave the CPU's caches, as a
# whole pass does (a pass reads every layer's weights once).
PAD_SAMPLE_BYTES = 96 << 20


@dataclass(frozen=True, slots=True)
class _Layer:
    norm1: torch.Tensor
    eps1: float
    q: tuple[torch.Tensor, torch.Tensor | None]
    k: tuple[torch.Tensor, torch.Tensor | None]
    v: tuple[torch.Tensor, torch.Tensor | None]
    o: tuple[torch.Tensor, torch.Tensor | None]
    norm2: torch.Tensor
    eps2: float
    gate: tuple[torch.Tensor, torch.Tensor | None]
    up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]


def _w(linear: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not isinstance(linear.weight, torch.Tensor):  # a quantized layer: its own forward
        raise AttributeError(f"{type(linear).__name__} has no plain weight")
    return linear.weight, linear.bias


class DirectDecoder:
    """One-token-per-row forward passes of a Llama-family model over a runner's cache
    (anything with ``update(keys, values, layer)``), returning ``[rows, vocab]`` logits."""

    def __init__(self, model: Any) -> None:
        self.verifies = False  # rows of several tokens too (``matches`` finds out)
        self.pad: Mapping[int, int] = {}  # a product's rows -> the rows it runs with
        body = model.model
        cfg = model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        first = body.layers[0].self_attn
        self.head_dim, self.scaling = first.head_dim, first.scaling
        self.embed = body.embed_tokens.weight
        self.inv_freq = body.rotary_emb.inv_freq
        self.rope_scaling = body.rotary_emb.attention_scaling
        self.norm, self.norm_eps = body.norm.weight, body.norm.variance_epsilon
        self.head = model.lm_head.weight
        self.layers = [
            _Layer(
                layer.input_layernorm.weight,
                layer.input_layernorm.variance_epsilon,
                _w(layer.self_attn.q_proj),
                _w(layer.self_attn.k_proj),
                _w(layer.self_attn.v_proj),
                _w(layer.self_attn.o_proj),
                layer.post_attention_layernorm.weight,
                layer.post_attention_layernorm.variance_epsilon,
                _w(layer.mlp.gate_proj),
                _w(layer.mlp.up_proj),
                _w(layer.mlp.down_proj),
            )
            for layer in body.layers
        ]

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """Logits ``[rows, vocab]`` of one new token per row (``input_ids`` and
        ``positions``: ``[rows, 1]``) attending through ``mask`` (``[rows, 1, 1, kv_len]``)."""
        return self.rows(input_ids, positions, mask, cache)[:, 0]

    def rows(
        self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """Logits ``[rows, q, vocab]`` of ``q`` new tokens per row (``input_ids`` and
        ``positions``: ``[rows, q]``) attending through ``mask`` (``[rows, 1, q, kv_len]``)."""
        x = F.embedding(input_ids, self.embed)
        cos, sin = self._rotary(positions, x.dtype)
        (rows, width), d = input_ids.shape, self.head_dim
        group = self.heads // self.kv_heads
        # A decode packs the heads that share a KV head onto it as extra queries. Rows of
        # several tokens keep one query per head and let SDPA share the KV heads
        # (``enable_gqa``): packed, their attention ran other kernel shapes, whose sums some
        # CPUs round otherwise than the model's forward. Bit-identical (``matches``).
        packed = group > 1 and width == 1
        for i, lay in enumerate(self.layers):
            h = _rms(x, lay.norm1, lay.eps1)
            q = self._linear(h, lay.q).view(rows, width, -1, d).transpose(1, 2)
            k = self._linear(h, lay.k).view(rows, width, -1, d).transpose(1, 2)
            v = self._linear(h, lay.v).view(rows, width, -1, d).transpose(1, 2)
            q = (q * cos) + (_rotate_half(q) * sin)
            k = (k * cos) + (_rotate_half(k) * sin)
            k, v = cache.update(k, v, i)
            if packed:
                q = q.reshape(rows, self.kv_heads, group, d)
            a = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=self.scaling, enable_gqa=group > 1 and not packed
            )
            a = a.reshape(rows, -1, width, d).transpose(1, 2).contiguous()
            x = x + self._linear(a.reshape(rows, width, -1).contiguous(), lay.o)
            h = _rms(x, lay.norm2, lay.eps2)
            up = F.silu(self._linear(h, lay.gate)) * self._linear(h, lay.up)
            x = x + self._linear(up, lay.down)
        return self._linear(_rms(x, self.norm, self.norm_eps), (self.head, None))

    def _linear(
        self, x: torch.Tensor, weight: tuple[torch.Tensor, torch.Tensor | None]
    ) -> torch.Tensor:
        """``F.linear`` of ``x`` (``[rows, width, in]``), its rows padded with zeros to
        ``self.pad``'s count for theirs."""
        rows, width = x.shape[0], x.shape[1]
        to = self.pad.get(rows * width)
        if to is None:
            return F.linear(x, *weight)
        flat = F.pad(x.reshape(rows * width, -1), (0, 0, 0, to - rows * width))
        return F.linear(flat, *weight)[: rows * width].view(rows, width, -1)

    def tune_padding(self) -> dict[int, int]:
        """Set ``pad`` from the time of this model's products at 1 to ``PAD_ROWS`` rows."""
        pad = choose_padding(self._product_times())
        if pad:
            log.info("products of %s rows run padded to %s", list(pad), list(pad.values()))
        self.pad = pad
        return pad

    @torch.inference_mode()
    def _product_times(self, rounds: int = 5) -> dict[int, float]:
        """Seconds of the linear layers' products at each row count, the fastest of
        ``rounds`` interleaved rounds, over the layers' weights in order until
        ``PAD_SAMPLE_BYTES`` (all of a small model's)."""
        sample, size = [], 0
        for lay in self.layers:
            for wb in (lay.q, lay.k, lay.v, lay.o, lay.gate, lay.up, lay.down):
                sample.append(wb)
                size += wb[0].numel() * wb[0].element_size()
            if size >= PAD_SAMPLE_BYTES:
                break
        sample.append((self.head, None))
        dev, dtype = self.embed.device, self.embed.dtype
        inputs = {
            m: {
                n: torch.ones(m, n, device=dev, dtype=dtype)
                for n in {w.shape[1] for w, _ in sample}
            }
            for m in range(1, PAD_ROWS + 1)
        }
        best = dict.fromkeys(inputs, float("inf"))
        for r in range(rounds + 1):  # the first round warms up
            for m, xs in inputs.items():
                t0 = time.perf_counter()
                for w, b in sample:
                    F.linear(xs[w.shape[1]], w, b)
                if r:
                    best[m] = min(best[m], time.perf_counter() - t0)
        return best

    def matches(self, run: Callable[..., torch.Tensor]) -> bool:
        """Whether ``run`` (the model's own forward through the runner) gives bit-identical
        logits on a probe: three rows at different positions over made-up keys and values.
        ``verifies`` says the same of rows of three new tokens each."""
        ok = self._probe(run, width=1)
        # Verifying rows are probed over a longer context and two widths: a CPU's kernels
        # may sum a short context's rows as the model does and a longer one's not.
        self.verifies = ok and all(
            self._probe(run, width=w, context=c) for w, c in ((3, 5), (3, 60), (6, 120))
        )
        return ok

    def _probe(self, run: Callable[..., torch.Tensor], width: int, context: int = 5) -> bool:
        rows, kv_len = 3, context + width
        dev = self.embed.device
        ids = torch.arange(1, rows * width + 1, device=dev).view(rows, width) % self.embed.shape[0]
        last = torch.tensor([[0], [2], [1]], device=dev)  # rows at different positions
        pos = context - 1 - last + torch.arange(width, device=dev)
        cols = torch.arange(kv_len, device=dev).view(1, 1, 1, -1)
        mask = cols <= pos.view(rows, 1, width, 1)
        shape = (len(self.layers), rows, self.kv_heads, kv_len, self.head_dim)
        with torch.inference_mode():
            theirs = run(ids, pos, kv_len, _ProbeCache(shape, self.embed), width)
            ours = self.rows(ids, pos, mask, _ProbeCache(shape, self.embed))
        return bool(torch.equal(theirs, ours))

    def _rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """Cosines and sines ``[rows, 1, q, head_dim]``, as the model's rotary module."""
        inv = self.inv_freq.to(device=positions.device, dtype=torch.float)
        freqs = positions[..., None].float() * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scaling).to(dtype=dtype)
        sin = (emb.sin() * self.rope_scaling).to(dtype=dtype)
        return cos.unsqueeze(1), sin.unsqueeze(1)


def choose_padding(times: Mapping[int, float], gain: float = PAD_GAIN) -> dict[int, int]:
    """For each row count of ``times`` (seconds of a product), the larger count to pad it
    to: the fastest larger one, where it took at most ``gain`` of the count's own time."""
    pad = {}
    for m, t in times.items():
        larger = [n for n in times if n > m]
        if larger:
            n = min(larger, key=lambda c: (times[c], c))
            if times[n] <= gain * t:
                pad[m] = n
    return pad


# Each model's padding, measured once for every runner on its weights (each engine's).
_PADDING: weakref.WeakKeyDictionary[Any, dict[int, int]] = weakref.WeakKeyDictionary()


def direct_decoder(
    model: Any, run: Callable[..., torch.Tensor], pad: bool = True
) -> DirectDecoder | None:
    """A direct decoder for ``model`` when its class and config are of the plain kind and
    it reproduces ``run`` (the runner's own forward: ``(ids, positions, kv_len, cache,
    keep)`` → logits ``[rows, 1, vocab]``) bit for bit on a probe; None otherwise. With
    ``pad``, on a CPU, its products padded where that is measured faster."""
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or {"rope_type": "default"}
    plain = (
        type(model).__name__ in DIRECT
        and getattr(cfg, "_attn_implementation", "sdpa") == "sdpa"
        and getattr(cfg, "hidden_act", None) == "silu"
        and getattr(cfg, "pretraining_tp", 1) == 1
        and rope.get("rope_type", "default") in STATIC_ROPE
        and not getattr(cfg, "mlp_bias", False)
        and len(set(getattr(cfg, "layer_types", None) or ["full_attention"])) == 1
    )
    if not plain:
        return None
    try:
        decoder = DirectDecoder(model)
    except AttributeError:  # a module laid out otherwise than the class above
        return None
    if not decoder.matches(run):
        return None
    if pad and decoder.embed.device.type == "cpu":
        known = _PADDING.get(model)
        if known is None:
            _PADDING[model] = decoder.tune_padding()
        else:
            decoder.pad = known
    return decoder


class _ProbeCache:
    """A cache of a few positions of made-up keys and values, the new token written last."""

    def __init__(self, shape: tuple[int, ...], like: torch.Tensor) -> None:
        """``shape``: layers, rows, KV heads, positions, head size."""
        gen = torch.Generator(device="cpu").manual_seed(0)
        self.k = torch.randn(shape, generator=gen).to(like.device, like.dtype)
        self.v = torch.randn(shape, generator=gen).to(like.device, like.dtype)

    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int, **_: Any) -> tuple[Any, Any]:
        width = k.shape[2]
        self.k[layer, :, :, -width:] = k
        self.v[layer, :, :, -width:] = v
        return self.k[layer], self.v[layer]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.k.shape[3])


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: in float32, back to the input's type before the weight. On float32
    rows and weights, torch's own ``rms_norm``: the same arithmetic in one call (a
    tiny model's decode pass has a dozen norms of eight operators each)."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps)).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
