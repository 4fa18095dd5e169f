"""Bulk generation: OpenAI batch files through Kafka at bulk priority (``tokenwire bulk``)."""
