"""Operator tools: the dead-letter queue (``tokenwire dlq``) and the status screen
(``tokenwire status``)."""
