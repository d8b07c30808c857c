"""Support modules of the RnB harness: config, GPUs, time cards, job logs, sources.

The process model itself lives in the top-level modules (benchmark.py,
client.py, runner.py, control.py, selector.py); this package holds what they
share so that each of those files stays about one thing.
"""
