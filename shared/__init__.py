"""tokenwire's wire contract: every message on Kafka and Redis, its codec, names and settings."""
