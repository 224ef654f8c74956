"""Bytes per GPU of the most loaded pipeline stage (`memory_per_gpu`: weights, gradients, optimizer state,
activations per recompute policy and micro-batches in flight, allowances) against the accelerator's usable
capacity (`capacity_bytes`), and what each training stack's words mean for those bytes (`stacks`: the stack
tables of measurements/ as one immutable `Stacks`, built by `stacks_from_frames`; `presets`: a source's other words).

Reads the same `models.core.Inputs` as the time model. Imports models.core and models.arch."""

from models.core.lazy import entry_points

__getattr__, __dir__, __all__ = entry_points(__name__, {
    "MemoryOptions": "models.memory.model",
    "capacity_bytes": "models.memory.model",
    "memory_inputs": "models.memory.model",
    "memory_per_gpu": "models.memory.model",
    "Stacks": "models.memory.stacks",
    "stacks_from_frames": "models.memory.stacks",
})
