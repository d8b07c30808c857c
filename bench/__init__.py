"""Performance benchmarks: ratios measured side by side in one run (`python bench/run.py`, `rnb-bench`)."""
