"""A consumer's reused input buffers, shared by every engine's transport."""
from __future__ import annotations

import torch


class LocalBuffers:
    """A consumer's private copies of its producers' slots, allocated once per tensor and reused.

    Reading a slot into a fresh tensor costs an allocation per item, and for
    tensors of many MB the page faults of new memory cost as much as the copy
    itself.  One buffer per (tensor position, shape, dtype) serves every
    producer slot of that form, since a runner handles one item at a time.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.on_cuda = device.type == "cuda"
        self._buffers: dict[tuple[int, torch.Size, torch.dtype], torch.Tensor] = {}
        self._by_slot: dict[int, torch.Tensor] = {}  # id of a producer's slot tensor (they live all job) -> buffer

    def like(self, index: int, slot: torch.Tensor) -> torch.Tensor:
        """The buffer for tensor `index` of a slot shaped like `slot`, on this consumer's device."""
        buffer = self._by_slot.get(id(slot))
        if buffer is None:
            buffer = self._by_slot[id(slot)] = self.shaped(index, slot)
        return buffer

    def shaped(self, index: int, tensor: torch.Tensor) -> torch.Tensor:
        """The buffer for tensor `index` of `tensor`'s shape and dtype, for tensors that arrive anew each item.

        Unlike `like`, it remembers nothing of `tensor` itself: the Ray engine's
        inputs are fresh objects per item, whose ids Python reuses.
        """
        key = (index, tensor.shape, tensor.dtype)
        if key not in self._buffers:
            self._buffers[key] = torch.empty(tensor.shape, dtype=tensor.dtype, device=self.device)
        return self._buffers[key]
