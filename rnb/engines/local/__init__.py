"""The local engine: spawned processes on one host, shared slots and rings of messages in shared memory (driver.py)."""
