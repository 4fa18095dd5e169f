"""``tokenwire index``: build and change the retrieval indexes (``cli.py``)."""
