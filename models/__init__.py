"""stepcast models (pure: no Dagster, no file or database I/O).

Sub-packages, each depending only on those listed before it (docs/architecture.md maps them):
core, arch, memory, physics, fitting, planning; corpus reads published runs with core, arch and memory.
"""
