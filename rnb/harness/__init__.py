"""The process model: who spawns whom (`job.py`) and what each process runs (`runner.py`, `client.py`)."""
