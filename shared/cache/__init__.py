"""Response caches, the pure parts: which requests may be cached and under which key
(``keys.py``), and the check a semantic hit must pass besides the similarity
(``guard.py``). The Redis and FAISS halves live with the edge (``services/edge/cache.py``,
``services/edge/semantic.py``); the worker stores finished answers (``services/worker/
settle.py``)."""
