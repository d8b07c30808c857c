"""The tools behind `python -m episodes`: checks and measurements built on the library's public API.

- `verify`: every episode's frames, byte-range path against a full-file
  decode, compared bit for bit (`python -m episodes verify`);
- `streaming`: LeRobot's episode-streaming benchmark tracks side by side
  (`python -m episodes bench`).

The library never imports them; only the command line (episodes.__main__)
and RnB's benchmarks do.
"""
