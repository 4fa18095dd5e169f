"""Retrieval: knowledge-base indexes of passages and the grounding of prompts with them.

- ``chunking.py``: text files cut into overlapping passages.
- ``vectors.py``: which FAISS index a size gets (exact or IVF), its build and tuning.
- ``store.py``: indexes on disk, versioned; build, add, remove, load, current version.
- ``retriever.py``: a batch of queries embedded at once and searched, per index.
- ``grounding.py``: passages placed after the system prompt, within a token budget.
"""
