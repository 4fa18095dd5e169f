"""The end-to-end benchmark's same-run baselines: the engine alone in this process, and
Hugging Face ``generate`` one request at a time."""

from __future__ import annotations

import time
import uuid
from typing import Any

from services.bench.drivers import Throughput


class Baselines:
    """The engine alone, in this process (no Kafka, Redis or HTTP), and HF ``generate``
    one request at a time, on the same model and requests as the pipeline."""

    def __init__(self, model_dir: str) -> None:
        from services.worker.engine.engine import Engine
        from services.worker.engine.wire import EngineConfig
        from services.worker.loader import load_model

        self.model, self.tokenizer = load_model(model_dir)
        self.engine = Engine(
            self.model, self.tokenizer, EngineConfig(kv_budget_tokens=65_536, max_running=64)
        )

    def jobs(self, bodies: list[dict[str, Any]]) -> list[tuple[list[int], int]]:
        return [(self.tokenizer(b["prompt"])["input_ids"], b["max_tokens"]) for b in bodies]

    def engine_closed_loop(
        self, bodies: list[dict[str, Any]], concurrency: int
    ) -> tuple[Throughput, list[float]]:
        """tokens/s with ``concurrency`` requests kept in flight (taken from the end, as the
        pipeline's clients do), and each request's time from submission to its first text
        (what a streaming client sees first: a token that ends mid-character has none)."""
        from services.worker.engine.wire import EngineRequest

        engine, queue = self.engine, self.jobs(bodies)
        inflight = produced = 0
        added: dict[str, float] = {}
        ttft: list[float] = []
        full: tuple[float, int] | None = None  # when fewer streams began to run; tokens then
        t0 = time.perf_counter()
        while queue or engine.has_work:
            if full is None and not queue and inflight < concurrency < len(bodies):
                full = time.perf_counter(), produced
            while queue and inflight < concurrency:
                prompt, max_tokens = queue.pop()
                rid = uuid.uuid4().hex
                engine.add_request(
                    EngineRequest(rid, prompt, max_tokens=max_tokens, ignore_eos=True)
                )
                added[rid] = time.perf_counter()
                inflight += 1
            for o in engine.step():
                if o.request_id in added and (o.text or o.finish is not None):
                    ttft.append(time.perf_counter() - added.pop(o.request_id))
                produced += len(o.token_ids)
                inflight -= o.finish is not None
        end = time.perf_counter()
        full_at, full_tokens = full or (end, produced)
        return Throughput(produced / (end - t0), full_tokens / (full_at - t0)), ttft

    def serial_generate(self, bodies: list[dict[str, Any]]) -> float:
        from services.bench.engine_bench import hf_serial

        jobs = self.jobs(bodies)
        return hf_serial(self.model, [p for p, _ in jobs], [n for _, n in jobs])
