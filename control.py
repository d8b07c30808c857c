"""RnB's shared plumbing (flag, slots, queues), now `rnb.harness.control`."""
from rnb.harness.control import POLL_S, LocalBuffers, Plumbing, SharedSlot, Termination, TerminationFlag

__all__ = ["POLL_S", "LocalBuffers", "Plumbing", "SharedSlot", "Termination", "TerminationFlag"]
