"""The edge responder: OpenAI-compatible HTTP in, token streams from Redis out."""
