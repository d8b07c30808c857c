"""A stand-in engine, as a new engine is added: this package plus one entry in rnb.engines.registry.ENGINES.

tests/engines/test_engine_registry.py adds the entry for its tests only.
"""
