"""Benchmarks that print ratios against baselines measured in the same run.

One module per command: ``engine_bench`` (``tokenwire bench engine``), ``batcher_bench``,
``edge_bench``, ``e2e_bench``, ``infra_bench`` (Redis and Kafka with the project's own
messages) and ``index_bench`` (``tokenwire bench index``: FAISS and
query embedding); the e2e benchmark's parts are ``workload``, ``drivers``,
``baselines``, ``prometheus`` and ``report``. Shared by all: ``cluster`` (service processes
on one topic prefix, a recorder of token events), ``sse_client`` (cheap SSE clients),
``stats`` (percentiles, the interval of a median) and ``cpu`` (a process's CPU seconds).
With ``--costs PATH``, the edge, batcher, e2e and infra benchmarks merge what they measured
into the costs file ``tokenwire plan`` reads (``services/ops/costs.py``).
"""
