"""Imported by the fork server after its preload (rnb.engines.local.lifeline): what the preload made, frozen.

Frozen objects are left out of every garbage collection: the server's last
one, as it leaves, and those of the children forked from it, which would
otherwise walk the few hundred thousand objects torch, torchvision and
torchcodec made (about 0.2 s each on this host), and write to the pages
that hold them.  Python's documentation advises `gc.freeze()` before a
fork for the second reason.
"""
import gc

gc.freeze()
