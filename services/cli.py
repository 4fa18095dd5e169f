"""The ``tokenwire`` command: run a service, build the model, export schemas, ask a question."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias

from services.bench.sections import SECTIONS
from services.keys import add_keys_parser
from services.ops.costs import add_costs_option
from shared.logs import route_transformers_logs, setup_logging
from shared.settings import CommonSettings, SettingsError

if TYPE_CHECKING:
    from services.worker.config import WorkerSettings
    from services.worker.runtime import EngineSpec

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class _Service(Protocol):
    async def run(self) -> None: ...
    def stop(self) -> None: ...


async def _serve_until_signal(make: Callable[[], _Service]) -> None:
    """Build a service inside the event loop and run it; SIGTERM or SIGINT asks it to stop
    gracefully."""
    service = make()
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals > 1:  # a second signal: stop now, without draining
            os._exit(130)
        service.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await service.run()


def resolve_model_dir(explicit: str, preset: str = "tiny") -> str:
    """The configured model folder (``TW_MODEL_DIR``), or the embedded default model (built
    if missing)."""
    if explicit:
        return model_folder(explicit)
    from services.model.build import default_cache_dir, ensure_model

    return str(ensure_model(preset, default_cache_dir(), log=lambda m: print(m, file=sys.stderr)))


def model_folder(path: str) -> str:
    """``path``, the ``TW_MODEL_DIR`` a service was given, if it holds a model; else the
    one-line refusal."""
    if not (Path(path) / "config.json").is_file():
        raise SettingsError(
            f"TW_MODEL_DIR={path!r} is not a model folder: it holds no config.json "
            "(a Hugging Face model as save_pretrained writes it)"
        )
    return path


def _draft_model_dir(name: str) -> str:
    """``TW_SPEC_DRAFT_MODEL``: a preset's name (built if missing) or a model folder."""
    from services.model.presets import PRESETS

    return resolve_model_dir("", name) if name in PRESETS else name


def worker_engine_spec(settings: WorkerSettings) -> EngineSpec:
    """The engine process a worker of ``settings`` starts: model, device and engine sizes."""
    from services.worker.engine.wire import EngineConfig
    from services.worker.runtime import EngineSpec

    return EngineSpec(
        model_dir=settings.model_dir,
        device=settings.device,
        dtype=settings.dtype,
        quantize=settings.quantize,
        torch_threads=settings.torch_threads,
        nice=settings.engine_nice,
        config=EngineConfig(
            block_size=settings.block_size,
            kv_budget_tokens=settings.kv_budget_tokens,
            kv_budget_bytes=settings.kv_budget_bytes,
            max_running=settings.max_running,
            max_step_tokens=settings.max_step_tokens,
            prefill_chunk=settings.prefill_chunk,
            enable_prefix_cache=settings.prefix_cache,
            speculation=settings.speculation,
            cuda_graphs=settings.cuda_graphs,
            pad_products=settings.pad_products,
            overlap=settings.overlap,
        ),
        draft_model_dir=_draft_model_dir(settings.spec_draft_model),
        log_level=settings.log_level,
    )


def cmd_worker(_: argparse.Namespace) -> None:
    from services.worker.config import WorkerSettings
    from services.worker.runtime import EngineProcess
    from services.worker.service import WorkerService

    settings = WorkerSettings.from_env(
        model_dir=resolve_model_dir(os.environ.get("TW_MODEL_DIR", ""))
    )
    setup_logging("worker", settings.log_level)
    spec = worker_engine_spec(settings)
    runner = EngineProcess(spec)
    # The engine process loads the model while this one loads the tokenizer (transformers
    # imports torch for it: seconds on a small machine).
    runner.launch()
    try:
        from transformers import AutoTokenizer

        route_transformers_logs()
        tokenizer = AutoTokenizer.from_pretrained(settings.model_dir, local_files_only=True)
        runner.wait_ready()
        logging.getLogger("tokenwire.worker").info(
            "worker %s serving %s (engine pid %s)",
            settings.worker_id,
            settings.model_dir,
            runner.pid,
        )
        asyncio.run(_serve_until_signal(lambda: WorkerService(settings, runner, tokenizer)))
    finally:
        runner.stop()


def cmd_batcher(_: argparse.Namespace) -> None:
    from services.batcher.config import BatcherSettings
    from services.batcher.service import BatcherService

    settings = BatcherSettings.from_env()
    setup_logging("batcher", settings.log_level)
    tokenizer = None
    if settings.model_dir:
        from shared.prompts import load_prompts

        tokenizer = load_prompts(model_folder(settings.model_dir))
    asyncio.run(_serve_until_signal(lambda: BatcherService(settings, tokenizer)))


def cmd_edge(_: argparse.Namespace) -> None:
    from services.edge.config import EdgeSettings
    from services.edge.server import serve

    settings = EdgeSettings.from_env()
    if settings.model_dir:
        model_folder(settings.model_dir)
    setup_logging("edge", settings.log_level)
    serve(settings)


def cmd_topics(args: argparse.Namespace) -> None:
    from shared.kafka_io import ensure_topics

    settings = CommonSettings.from_env()
    n = settings.names
    parts = {
        n.requests: args.requests,
        n.batches: args.batches,
        n.completions: args.completions,
        n.requests_dlq: 1,
    }
    from services.batcher.config import BatcherSettings

    for source in BatcherSettings.from_env().sources:  # backend services' own topics
        parts[n.requests_from(source.name)] = args.requests
        parts[n.completions_to(source.name)] = args.completions
    created = asyncio.run(ensure_topics(settings, parts))
    print(f"topics ready ({', '.join(created) or 'all existed'} created)")


def cmd_model_build(args: argparse.Namespace) -> None:
    from services.model.build import default_cache_dir, ensure_model

    out = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    print(ensure_model(args.preset, out, force=args.force))


def cmd_schema(args: argparse.Namespace) -> None:
    from shared.schemas import export_schemas, stale_schemas

    if args.check:
        stale = stale_schemas()
        if stale:
            sys.exit(f"stale JSON schemas (run `tokenwire schema`): {', '.join(stale)}")
        print("schemas up to date")
        return
    for path in export_schemas():
        print(path)


def cmd_ask(args: argparse.Namespace) -> None:
    from services.ask import stream_completion

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            stream_completion(args.url, args.prompt, args.max_tokens, args.model, sys.stdout)
        )


def cmd_bench_engine(args: argparse.Namespace) -> None:
    import torch

    from services.bench.engine_bench import BenchConfig, run

    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = args.model_dir or resolve_model_dir("", args.preset)
    cfg = BenchConfig()
    if args.quick:  # a smoke configuration: proves the command works, measures little
        cfg = BenchConfig(
            concurrencies=(1, 4),
            prompt_len=16,
            new_tokens=8,
            serial_requests=1,
            prefix_len=64,
            suffix_len=8,
            prefix_requests=4,
            prefix_new_tokens=4,
        )
    if args.concurrency:
        cfg.concurrencies = tuple(args.concurrency)
    if args.prompt_len:
        cfg.prompt_len = args.prompt_len
    if args.new_tokens:
        cfg.new_tokens = args.new_tokens
    if args.no_generate_batch:
        cfg.with_generate_batch = False
    if args.only:
        cfg.sections = tuple(s for s in SECTIONS if s in args.only)
    cfg.spec_k = args.spec_k
    if "draft" in cfg.sections:
        cfg.draft_model, cfg.draft_k = _draft_model_dir(args.draft_model), args.draft_k
    run(model_dir, cfg, Path(args.out) if args.out else None, args.device, args.dtype)


def cmd_bench_batcher(args: argparse.Namespace) -> None:
    from services.bench.batcher_bench import run

    env = {**os.environ}
    env.setdefault("TW_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
    env.setdefault("TW_REDIS_URL", "redis://127.0.0.1:16379/0")
    model_dir = args.model_dir or resolve_model_dir("", "tiny")
    out = Path(args.out) if args.out else None
    run(env, model_dir, out, quick=args.quick, costs=Path(args.costs) if args.costs else None)


def cmd_bulk_submit(args: argparse.Namespace) -> None:
    from services.bulk.runner import submit_file

    settings = CommonSettings.from_env()
    setup_logging("bulk", "WARNING")
    stats = asyncio.run(
        submit_file(
            settings,
            Path(args.input),
            Path(args.output),
            tenant=args.tenant,
            max_in_flight=args.max_in_flight,
            progress=not args.quiet,
        )
    )
    print(
        f"{stats.written} results written ({stats.errors} errors), "
        f"{stats.skipped} already in {args.output}, {stats.total} lines"
    )


def cmd_bulk_api_check(args: argparse.Namespace) -> None:
    import orjson

    from services.bench.batch_api import run as run_batch

    report = asyncio.run(
        run_batch(
            args.url,
            args.api_key,
            lines=args.lines,
            endpoint=args.endpoint,
            model=args.model,
            max_tokens=args.max_tokens,
        )
    )
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    if report["status"] != "completed" or not report["each_custom_id_once"]:
        sys.exit(1)


def cmd_bench_e2e(args: argparse.Namespace) -> None:
    from services.bench.e2e_bench import QUICK, E2EConfig, run

    env = {**os.environ}
    env.setdefault("TW_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
    env.setdefault("TW_REDIS_URL", "redis://127.0.0.1:16379/0")
    model_dir = args.model_dir or resolve_model_dir("", args.preset)
    if args.profile == "cluster":
        from services.bench import profiles

        pcfg = profiles.QUICK if args.quick else profiles.ProfileConfig()
        if args.concurrency:
            pcfg.concurrency = int(args.concurrency.split(",")[-1])
        if args.rounds:
            pcfg.rounds = args.rounds
        profiles.run(env, model_dir, f"tokenwire-{args.preset}", pcfg, Path(args.out))
        return
    cfg = QUICK if args.quick else E2EConfig()
    if args.concurrency:
        cfg.concurrencies = tuple(int(c) for c in args.concurrency.split(","))
    if args.rounds:
        cfg.rounds = args.rounds
    if args.output_tokens:
        lo, hi = (int(x) for x in args.output_tokens.split(","))
        cfg.workload.output_tokens = (lo, hi)
    costs = Path(args.costs) if args.costs else None
    run(env, model_dir, f"tokenwire-{args.preset}", cfg, Path(args.out), costs)


def cmd_chaos(args: argparse.Namespace) -> None:
    from services.chaos.report import render_table, to_json
    from services.chaos.runner import run
    from services.chaos.stack import ChaosError, Stack

    setup_logging("chaos", "WARNING")
    try:
        stack = Stack.from_environ()
        rows = asyncio.run(run(stack, args.scenarios, args.streams, args.max_tokens, args.settle))
    except ChaosError as exc:
        sys.exit(f"tokenwire chaos: {exc}")
    print(to_json(rows) if args.json else render_table(rows))
    if not all(r.clean for r in rows):
        sys.exit(1)


def _scenario_list(value: str) -> list[str]:
    from services.chaos import SCENARIOS

    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown scenario {', '.join(unknown) or '(none)'}; choose from {', '.join(SCENARIOS)}"
        )
    return names


def _add_chaos_parser(sub: Subparsers) -> None:
    from services.chaos import SCENARIOS

    listing = "; ".join(f"{name}: {about}" for name, about in SCENARIOS.items())
    c = sub.add_parser(
        "chaos",
        help="fault scenarios against the running stack, as one table",
        description="Runs fault scenarios against the one-node stack that infra/stack.sh "
        "started with this environment (TW_STACK, TW_RUN_DIR, ports, TW_TOPIC_PREFIX; the "
        "cluster profile is refused) and prints, per "
        "scenario: requests, completed, lost, duplicated, process exits (besides the one a "
        "kill scenario causes) and the longest stall of a running stream. Exits 1 unless "
        "every row has 0 lost, 0 duplicated and 0 exits. It stops and starts the stack's "
        "Kafka and Redis: never point it at a stack others use.",
    )
    c.add_argument(
        "--scenarios",
        type=_scenario_list,
        default=list(SCENARIOS),
        metavar="NAME[,NAME...]",
        help=f"the scenarios to run, in order (default: all). {listing}",
    )
    c.add_argument(
        "--streams", type=int, default=8, help="concurrent streaming clients (default: 8)"
    )
    c.add_argument(
        "--max-tokens",
        type=int,
        default=16,
        help="tokens of each greedy load request (default: 16)",
    )
    c.add_argument(
        "--settle",
        type=float,
        default=5.0,
        help="seconds the load runs on after each fault before it stops (default: 5)",
    )
    c.add_argument("--json", action="store_true", help="print the rows as JSON, not a table")
    c.set_defaults(fn=cmd_chaos)


def _add_service_parsers(sub: Subparsers) -> None:
    sub.add_parser("worker", help="run a decode worker").set_defaults(fn=cmd_worker)
    sub.add_parser("batcher", help="run a batcher").set_defaults(fn=cmd_batcher)
    sub.add_parser("edge", help="run an HTTP edge").set_defaults(fn=cmd_edge)


def _add_topics_parser(sub: Subparsers) -> None:
    t = sub.add_parser("topics", help="create the Kafka topics")
    t.add_argument("action", choices=["create"], help="create the topics that do not exist yet")
    t.add_argument(
        "--requests",
        type=int,
        default=int(os.environ.get("TW_REQUESTS_PARTITIONS", "4")),
        help="partitions of the requests topic (default: $TW_REQUESTS_PARTITIONS or 4)",
    )
    t.add_argument(
        "--batches",
        type=int,
        default=int(os.environ.get("TW_BATCHES_PARTITIONS", "4")),
        help="partitions of the batches topic (default: $TW_BATCHES_PARTITIONS or 4)",
    )
    t.add_argument(
        "--completions",
        type=int,
        default=4,
        help="partitions of the completions topic, where finished results go (default: 4)",
    )
    t.set_defaults(fn=cmd_topics)


def _add_model_parser(sub: Subparsers) -> None:
    from services.model.presets import PRESETS

    m = sub.add_parser("model", help="the embedded default model")
    m.add_argument("action", choices=["build"], help="build the model unless already built")
    m.add_argument(
        "--preset",
        default="tiny",
        help=f"the model to build, one of {', '.join(PRESETS)} (default: tiny)",
    )
    m.add_argument(
        "--cache-dir",
        default="",
        help="folder of built models (default: $TOKENWIRE_CACHE/models, else "
        "~/.cache/tokenwire/models)",
    )
    m.add_argument("--force", action="store_true", help="rebuild even if a build exists")
    m.set_defaults(fn=cmd_model_build)


def _add_schema_parser(sub: Subparsers) -> None:
    s = sub.add_parser("schema", help="export JSON Schema of every wire message")
    s.add_argument("--check", action="store_true", help="fail if the committed schemas are stale")
    s.set_defaults(fn=cmd_schema)


def _model_options(p: argparse.ArgumentParser, preset: str) -> None:
    """``--preset`` and ``--model-dir``: the benchmarked model."""
    p.add_argument(
        "--preset",
        default=preset,
        help=f"embedded model preset, built if missing, when --model-dir is not given "
        f"(default: {preset})",
    )
    p.add_argument(
        "--model-dir", default="", help="a Hugging Face model folder to use instead of a preset"
    )


def _add_bench_engine_parser(bsub: Subparsers) -> None:
    be = bsub.add_parser("engine", help="the decode engine vs Hugging Face generate")
    _model_options(be, "small")
    be.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads (default: 0, torch's own)"
    )
    be.add_argument("--quick", action="store_true", help="a smoke configuration (CI)")
    be.add_argument(
        "--concurrency", type=int, nargs="+", help="concurrent requests per row (default: 1 8 32)"
    )
    be.add_argument(
        "--prompt-len", type=int, default=0, help="prompt tokens per request (default: 128)"
    )
    be.add_argument(
        "--new-tokens", type=int, default=0, help="tokens generated per request (default: 128)"
    )
    be.add_argument(
        "--no-generate-batch",
        action="store_true",
        help="leave out transformers' continuous batching (slow on CPU at high concurrency)",
    )
    be.add_argument(
        "--only",
        nargs="+",
        choices=["throughput", *SECTIONS],
        help="run the throughput rows and these parts only (default: every part; int8: "
        "TW_QUANTIZE=int8 against full precision, on the CPU; draft: draft-model speculation; "
        "padding: a CPU's few-row products padded where faster, against unpadded; overlap: a "
        "GPU's steps that make their text while the next pass runs, against lockstep)",
    )
    be.add_argument(
        "--draft-model",
        default="tiny",
        help="draft speculation's guessing model: a preset (built if missing) or a folder "
        "(default: tiny)",
    )
    be.add_argument(
        "--draft-k", type=int, default=4, help="tokens the draft model guesses per step (4)"
    )
    be.add_argument(
        "--spec-k", type=int, default=4, help="n-gram speculation's draft tokens per step (4)"
    )
    be.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="where the model runs (default: auto, CUDA when available)",
    )
    be.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="weights' precision (default: auto, float32 on CPU and bfloat16 on CUDA)",
    )
    be.add_argument(
        "--out",
        default="reports/bench_engine.json",
        help="the JSON report (default: reports/bench_engine.json)",
    )
    be.set_defaults(fn=cmd_bench_engine)


def _add_bench_batcher_parser(bsub: Subparsers) -> None:
    bb = bsub.add_parser(
        "batcher", help="window and routing on a local cluster (needs Kafka, Redis)"
    )
    bb.add_argument(
        "--model-dir", default="", help="a model folder (default: the embedded tiny model)"
    )
    bb.add_argument("--quick", action="store_true", help="a smoke configuration (CI)")
    bb.add_argument(
        "--out",
        default="reports/bench_batcher.json",
        help="the JSON report (default: reports/bench_batcher.json)",
    )
    add_costs_option(bb, "batcher_requests_per_s")
    bb.set_defaults(fn=cmd_bench_batcher)


def _add_bench_e2e_parser(bsub: Subparsers) -> None:
    e2e = bsub.add_parser("e2e", help="the whole pipeline under load vs engine-alone and generate")
    _model_options(e2e, "small")
    e2e.add_argument("--concurrency", default="", help="closed-loop streams per level, e.g. 1,8,32")
    e2e.add_argument("--rounds", type=int, default=0, help="pipeline/baseline rounds per level")
    e2e.add_argument("--output-tokens", default="", help="output length range, e.g. 16,64")
    e2e.add_argument("--quick", action="store_true", help="a smoke configuration (CI)")
    e2e.add_argument(
        "--profile",
        choices=("single", "cluster"),
        default="single",
        help="cluster: the cluster profile (3 Kafka brokers, a 3-shard Redis Cluster) beside "
        "the single-node stack, each on servers of its own, in alternating rounds at the "
        "last --concurrency (tokens/s ratio, each service's CPU per token)",
    )
    e2e.add_argument(
        "--out",
        default="reports/e2e",
        help="folder of report.json, the plots and the services' logs (default: reports/e2e)",
    )
    add_costs_option(
        e2e,
        "each service's CPU per token (worker, engine, batcher, edge), the batcher's per "
        "request and the pipeline's tokens/s",
    )
    e2e.set_defaults(fn=cmd_bench_e2e)


def _add_bench_parser(sub: Subparsers) -> None:
    b = sub.add_parser("bench", help="benchmarks (ratios against same-run baselines)")
    bsub = b.add_subparsers(dest="bench", required=True)
    _add_bench_engine_parser(bsub)
    _add_bench_batcher_parser(bsub)
    # Listed here; its options are the edge benchmark's own (main() hands them over).
    bsub.add_parser("edge", help="events/s one edge relays and the latency it adds")
    bsub.add_parser("infra", help="token events/s one Redis core and records/s one broker take")
    _add_bench_e2e_parser(bsub)
    _add_bench_index_parser(bsub)
    _add_bench_cache_parser(bsub)


def _add_bulk_parser(sub: Subparsers) -> None:
    bulk = sub.add_parser("bulk", help="OpenAI batch files through Kafka at bulk priority")
    bulk_sub = bulk.add_subparsers(dest="bulk", required=True)
    bs = bulk_sub.add_parser("submit", help="run IN.jsonl, append results to OUT.jsonl (resumable)")
    bs.add_argument("input", help="the OpenAI batch input file (JSONL, one request a line)")
    bs.add_argument(
        "output", help="the results file (JSONL), appended to; lines already in it are skipped"
    )
    bs.add_argument(
        "--tenant", default="bulk", help="tenant the requests are queued under (default: bulk)"
    )
    bs.add_argument(
        "--max-in-flight",
        type=int,
        default=256,
        help="requests sent and not yet answered, at most (default: 256)",
    )
    bs.add_argument("--quiet", action="store_true", help="no progress bar")
    bs.set_defaults(fn=cmd_bulk_submit)
    bc = bulk_sub.add_parser(
        "api-check",
        help="send N generated lines through a running edge's Batch API (files, batches) "
        "and check the output has each custom_id once",
    )
    bc.add_argument("--url", default="http://127.0.0.1:8000", help="the edge's base URL")
    bc.add_argument("--api-key", default="twk-none", help="the key the batch is made with")
    bc.add_argument("--lines", type=int, default=500, help="requests in the batch (default: 500)")
    bc.add_argument("--max-tokens", type=int, default=4, help="max_tokens of each request")
    bc.add_argument("--model", default="tokenwire-tiny", help="the model the lines name")
    bc.add_argument(
        "--endpoint",
        default="/v1/completions",
        choices=["/v1/completions", "/v1/chat/completions"],
        help="the endpoint every line calls (default: /v1/completions)",
    )
    bc.set_defaults(fn=cmd_bulk_api_check)


def _add_ask_parser(sub: Subparsers) -> None:
    a = sub.add_parser("ask", help="stream a completion from an edge and print it")
    a.add_argument("prompt", help="the prompt to complete")
    a.add_argument(
        "--url",
        default=f"http://127.0.0.1:{os.environ.get('TW_EDGE_PORT', '8000')}",
        help="the edge (default: http://127.0.0.1:$TW_EDGE_PORT, port 8000 if unset); "
        "$TW_API_KEY is sent as its bearer token",
    )
    a.add_argument(
        "--model",
        default="tokenwire-tiny",
        help="the served model's name (default: tokenwire-tiny)",
    )
    a.add_argument(
        "--max-tokens", type=int, default=64, help="tokens to generate, at most (default: 64)"
    )
    a.set_defaults(fn=cmd_ask)


def _add_index_parser(sub: Subparsers) -> None:
    from services.retrieval.cli import add_parser

    add_parser(sub)


def cmd_bench_cache(args: argparse.Namespace) -> None:
    from services.bench.cache_bench import run as bench_cache

    bench_cache(args, resolve_model_dir(os.environ.get("TW_MODEL_DIR", "")))


def _add_bench_cache_parser(bsub: Subparsers) -> None:
    # Options only: the benchmark's stack (the edge's web framework, FAISS) is imported
    # when it runs, not to parse any command.
    bc = bsub.add_parser(
        "cache", help="response caches: hit and miss TTFT, lookup cost, a mix with repeats"
    )
    bc.add_argument("--probes", type=int, default=20, help="requests per TTFT row (default: 20)")
    bc.add_argument(
        "--mix", type=int, default=120, help="requests of the throughput mix (default: 120)"
    )
    bc.add_argument(
        "--concurrency", type=int, default=8, help="streams in flight in the mix (default: 8)"
    )
    bc.add_argument("--max-tokens", type=int, default=16, help="tokens per answer (default: 16)")
    bc.add_argument(
        "--out",
        default="reports/bench_cache.json",
        help="the JSON report (default: reports/bench_cache.json)",
    )
    bc.set_defaults(fn=cmd_bench_cache)


def _add_cache_parser(sub: Subparsers) -> None:
    from services.cache_cli import add_parser

    add_parser(sub)


def cmd_bench_index(args: argparse.Namespace) -> None:
    from services.bench.index_bench import run as bench_index

    bench_index(args)


def _add_bench_index_parser(bsub: Subparsers) -> None:
    # Options only: FAISS is imported when the benchmark runs, not to parse any command.
    bi = bsub.add_parser(
        "index", help="FAISS query latency and recall@10 by index size; query embedding by batch"
    )
    bi.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[10_000, 100_000],
        help="index sizes in vectors (default: 10000 100000; 1000000 needs ~5 GB and minutes)",
    )
    bi.add_argument("--no-embed", action="store_true", help="skip the query-embedding rows")
    bi.add_argument(
        "--out",
        default="reports/bench_index.json",
        help="the JSON report (default: reports/bench_index.json)",
    )
    bi.set_defaults(fn=cmd_bench_index)


def _add_ops_parsers(sub: Subparsers) -> None:
    from services.ops.dlq import add_parser as add_dlq_parser
    from services.ops.plan import add_parser as add_plan_parser
    from services.ops.status import add_parser as add_status_parser

    add_dlq_parser(sub)
    add_status_parser(sub)
    add_plan_parser(sub)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenwire", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    _add_service_parsers(sub)
    _add_topics_parser(sub)
    _add_model_parser(sub)
    _add_schema_parser(sub)
    _add_bench_parser(sub)
    _add_bulk_parser(sub)
    _add_ask_parser(sub)
    _add_chaos_parser(sub)
    _add_index_parser(sub)
    _add_cache_parser(sub)
    _add_ops_parsers(sub)
    add_keys_parser(sub)
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["bench", "edge"]:
        from services.bench.edge_bench import main as bench_edge

        bench_edge(argv[2:])
        return
    if argv[:2] == ["bench", "infra"]:
        from services.bench.infra_bench import main as bench_infra

        bench_infra(argv[2:])
        return
    args = build_parser().parse_args(argv)
    try:
        args.fn(args)
    except SettingsError as exc:
        sys.exit(str(exc))
    except Exception as exc:
        reason = None if argv[0] in SERVICES else unreachable(exc)
        if reason is None:
            raise
        sys.exit(f"tokenwire {argv[0]}: {reason}")


# The long-running commands: they wait an outage out, so one that escapes is a fault, and
# its traceback goes to their log.
SERVICES = ("worker", "batcher", "edge")


def unreachable(exc: BaseException) -> str | None:
    """A one-shot command's server that did not answer or refused it, in one line with the
    setting that names it; None for any other failure."""
    import httpx
    from aiokafka.errors import KafkaConnectionError
    from redis import exceptions as redis_errors

    refused = (
        redis_errors.AuthenticationError,
        redis_errors.AuthorizationError,
        redis_errors.MaxClientsReachedError,
    )
    if isinstance(exc, refused):
        return f"Redis refused this client ({exc}); TW_REDIS_URL names the server and user"
    if isinstance(exc, redis_errors.ConnectionError | redis_errors.TimeoutError):
        return f"Redis is not answering ({exc}); is the stack up? TW_REDIS_URL names it"
    if isinstance(exc, KafkaConnectionError):
        return f"Kafka is not answering ({exc}); is the stack up? TW_KAFKA_BOOTSTRAP names it"
    if isinstance(exc, httpx.TransportError):
        try:
            where = str(exc.request.url.copy_with(path="/", query=None)).rstrip("/")
        except RuntimeError:  # no request attached
            where = "the server"
        return f"no answer from {where} ({exc or type(exc).__name__})"
    return None


if __name__ == "__main__":
    main()
