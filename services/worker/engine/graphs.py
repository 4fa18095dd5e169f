"""Decode passes replayed from CUDA graphs.

On a GPU a small model's decode step is bound by the host: a few hundred kernel launches,
each with its Python around it, for arithmetic that takes the GPU microseconds. A CUDA
graph records one pass's kernels once and launches them all in one call. A graph's
shapes and addresses are fixed, so the runner pads a decode to a bucket of rows (1, 2, 4,
8, then multiples of 16) and attends over the whole capacity of its dense slots, masked
past each row's length: one graph serves every decode of that bucket and capacity. Its
inputs (token ids, positions, where each new token's KV goes) are copied into fixed
buffers before each replay.

A shape gets a graph only once it has run ``CAPTURE_AFTER`` times (the batch holds
still): shapes a filling batch passes through once run eagerly rather than pay a capture
each. At most ``MAX_GRAPHS`` are kept, the least recently used dropped first.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

CAPTURE_AFTER = 3
MAX_GRAPHS = 64
LARGEST = 512  # rows: a larger decode runs eagerly


def bucket_rows(rows: int, largest: int = LARGEST) -> int | None:
    """The rows a decode of ``rows`` rows is padded to; None past ``largest``."""
    if rows > largest:
        return None
    for b in (1, 2, 4, 8):
        if rows <= b:
            return b
    return min(-(-rows // 16) * 16, largest)


class DecodeGraphs:
    """Graphs of a padded decode pass, one per (rows, capacity).

    ``run_pass(inputs, capacity)`` is the pass: ``inputs`` is ``[fields, rows]`` of longs
    (a view of this object's fixed buffer), its result the logits ``[rows, vocab]``. With
    ``replay`` off the pass runs eagerly on the same buffers (a CPU, where graphs do not
    exist: the padded pass is tested there)."""

    def __init__(
        self,
        run_pass: Callable[[torch.Tensor, int], torch.Tensor],
        fields: int,
        device: torch.device,
        *,
        replay: bool = True,
        largest: int = LARGEST,
    ) -> None:
        self._run = run_pass
        self.replay = replay
        self.largest = largest
        self.inputs = torch.zeros((fields, largest), dtype=torch.long, device=device)
        self._runs: dict[tuple[int, int], int] = {}
        self._graphs: OrderedDict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]]
        self._graphs = OrderedDict()
        self._pool = torch.cuda.graph_pool_handle() if replay else None
        self.broken = False  # a capture failed: every decode runs eagerly from then on
        self.captures = 0
        self.replays = 0

    def run(self, host: torch.Tensor, capacity: int) -> torch.Tensor | None:
        """The logits of the padded decode ``host`` (``[fields, rows]``, rows a bucket) over
        slots of ``capacity``; None when that shape has no graph yet (run it eagerly)."""
        if self.broken:
            return None
        key = (host.shape[1], capacity)
        entry = self._graphs.get(key)
        if entry is None:
            seen = self._runs.get(key, 0) + 1
            self._runs[key] = seen
            if seen < CAPTURE_AFTER:
                return None
        static = self.inputs[:, : key[0]]
        static.copy_(host)
        if not self.replay:
            self.replays += 1
            return self._run(static, capacity)
        if entry is None:
            try:
                entry = self._capture(static, capacity)
            except RuntimeError:  # a capture or CUDA error: this step and the rest run eagerly
                log.exception("CUDA graph capture failed; decoding without graphs")
                self.broken = True
                self._graphs.clear()
                return None
            self._graphs[key] = entry
            if len(self._graphs) > MAX_GRAPHS:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        graph, out = entry
        graph.replay()
        self.replays += 1
        return out

    def _capture(
        self, static: torch.Tensor, capacity: int
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # A warm-up pass on a side stream first (libraries set up workspaces on first use,
        # which a capture must not see); it is this step's own pass, and it writes the
        # same keys and values the replay writes again.
        stream = torch.cuda.Stream(device=static.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._run(static, capacity)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._run(static, capacity)
        self.captures += 1
        return graph, out
