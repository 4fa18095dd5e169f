"""The batcher: groups arriving requests within a sliding window and routes them to workers."""
