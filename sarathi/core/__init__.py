"""Pure-Python scheduling core: sequences, batches, the KV block manager and the batching policies."""
