"""Workers: the processes (or the in-engine object) that hold model shards and run steps."""
