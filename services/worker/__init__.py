"""The decode worker: consumes batches from Kafka, runs the engine, streams tokens to Redis."""
