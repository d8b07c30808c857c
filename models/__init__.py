"""Runner models: one class per pipeline step kind, loaded by dotted path from a config.

Every model follows one contract so the generic runner can drive it
(rnb.core.model's `StepModelClass` and `StepModel`, which mypy holds every
class of `shipped.MODEL_CLASSES` to): `__init__(self, device, **kwargs)`, a
static `output_shape(**kwargs)` giving the maximum shape of each output
tensor (None when it has no tensor output), and `__call__(tensors,
non_tensors, time_card) -> (tensors, non_tensors, time_card)`, where a None
time card means "no output yet".

A step declares only what it produces: if `output_shape` (or `__init__`)
takes an `input_shapes` keyword, the harness passes the previous step's
output shapes there (the largest any input can be; None for step 0), so a
batcher or a network sizes itself from its input and a config need not
repeat the loader's geometry on every step.

Input tensors are valid only during the call: the runner copies each input
out of the producer's shared slot into buffers it reuses for the next item,
so a model that keeps an input beyond the call (a batcher, an aggregator of
segments) must clone it.  Outputs are copied into the runner's shared slot
before the model is called again.
"""
