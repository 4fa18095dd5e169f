"""The decode engine: a pure scheduler and KV-cache manager, and the torch model runner."""
