"""The local engine: spawned processes on one host, shared slots and torch.multiprocessing queues (driver.py)."""
