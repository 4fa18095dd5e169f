"""The edge responder: OpenAI-compatible HTTP and a WebSocket in, token streams from Redis out.

Stateless: any number of edges serve (and resume) any request. One process holds a Kafka
producer, a Redis client and shared pub/sub connections (``hub.py``: one per Redis node) that
carry every stream it relays.

Endpoints (``routes/``):

- ``POST /v1/completions``, ``POST /v1/chat/completions`` — OpenAI bodies, ``stream`` true
  (SSE: ``id:`` is the event's seq, ``: keep-alive`` comments, ``data: [DONE]``) or false.
  Extensions: ``priority`` (interactive|bulk), ``top_k``, ``ignore_eos``, and
  ``resumable`` (a disconnect does not cancel; resume instead). The response ``id`` and the
  ``X-Request-Id`` header are the request id used below.
- ``GET /v1/requests/{id}/stream`` with ``Last-Event-ID`` — the events after it, then the
  live rest, from any edge, while the replay log lives.
- ``POST /v1/requests/{id}/cancel`` — stops generation; answers with the final event's
  seq (``last_event_id``): no token follows it.
- ``/v1/ws`` — the same events over a WebSocket (protocol in ``routes/ws.py``).
- ``GET /v1/models``, ``/healthz`` (alive), ``/readyz`` (Kafka, Redis and pub/sub answer),
  ``/metrics`` (Prometheus), ``/chat`` (a chat page with a Stop button).

Admission (``submit.py``): API keys (``auth.py``: required unless ``TW_AUTH=off``, as in
the demo; stored peppered in the Redis hash ``<prefix>:apikeys`` by ``tokenwire keys``, each
with its tenant and policy; older SHA-256 digests in ``TW_API_KEYS`` still work) → 403/404
for a priority or model the key may not use → 400 for bad parameters (unknown model, max_tokens, prompt longer than the
context, counted with the model's tokenizer: ``model_info.py``) → 503 while the batchers'
queues exceed ``TW_MAX_QUEUED_REQUESTS`` (``load.py``) → 429 from per-key token buckets
(``ratelimit.py``) → the owner recorded, the stream subscribed and the request published
to Kafka, all at once. While Redis or Kafka is away new requests get 503 with
``Retry-After`` (``health.py``) and running streams wait it out. Bodies over
``TW_MAX_BODY_BYTES`` get 413 (``middleware.py``), as does a request larger than a Kafka
record (``submit.py``). Errors are OpenAI error JSON.

``python -m services.bench.edge_bench`` measures relay throughput and added latency.
"""
