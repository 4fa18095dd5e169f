"""Operator tools: the dead-letter queue (``tokenwire dlq``), the status screen
(``tokenwire status``) and the capacity plan (``tokenwire plan``: ``capacity`` is its pure
arithmetic, ``costs`` the measured costs file it reads)."""
