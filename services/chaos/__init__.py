"""``tokenwire chaos``: fault scenarios against a running stack, and one table of what the
clients saw.

Each scenario (``scenarios.py``) runs streaming clients through the edge (``load.py``),
breaks one thing (Redis, Kafka, a service process; ``stack.py`` reaches them through the
stack's own scripts and pid files) and accounts for every request it sent
(``accounting.py``): whether it got its answer, got anything twice, and how long a running
stream waited for its next event. ``report.py`` prints the rows.
"""

# Every scenario, in the order they run; a light table, so that the command line lists
# them without importing the clients.
SCENARIOS: dict[str, str] = {
    "redis-restart": "Redis stopped for 3 s and started again (infra/redis.sh) under the streams",
    "kafka-stop-10s": "the Kafka broker stopped for 10 s (infra/kafka.sh) under the streams",
    "kafka-stop-40s": "the broker stopped for 40 s, past the producers' 30 s timeout",
    "worker-kill": "the worker SIGKILLed while Kafka-reply requests finish (one Completion each)",
    "edge-kill": "the edge SIGKILLed mid-stream: its non-resumable requests must end cancelled",
    "poison": "temperature 1e-45 over HTTP and raw on Kafka, a request that fails in the "
    "worker, then a normal one",
}
