"""RnB's load generator, now `rnb.harness.client`."""
from rnb.harness.client import ClientSpec, generate

__all__ = ["ClientSpec", "generate"]
