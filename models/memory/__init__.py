"""Bytes per GPU of the most loaded pipeline stage (`memory_per_gpu`: weights, gradients, optimizer state,
activations per recompute policy and micro-batches in flight, allowances) against the accelerator's usable
capacity (`capacity_bytes`), and what each training stack's words mean for those bytes (`presets`).

Reads the same `models.core.Inputs` as the time model. Imports models.core and models.arch."""

from models.memory.model import MemoryOptions, capacity_bytes, memory_inputs, memory_per_gpu

__all__ = ["MemoryOptions", "capacity_bytes", "memory_inputs", "memory_per_gpu"]
