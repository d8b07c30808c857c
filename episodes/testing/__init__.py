"""Test and bench tooling for the episodes package: never imported by the library itself.

- `server`: Debian's nginx serving a dataset directory on loopback, with
  fault locations, optionally behind `network`'s slower link;
- `network`: a loopback relay with a bandwidth and a round-trip time;
- `faults`: an HTTP server that misbehaves on purpose, request by request.

They live here rather than under tests/ because RnB's benchmarks (bench/)
serve datasets with them too, and bench must not import the test tree.
The dataset generator they use is public: `episodes.synthetic`.
"""
