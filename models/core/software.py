"""Software presets: the physical parameters of a training stack's era (pure).

A run's ``software_preset`` names the physics it is predicted with: ``default`` (today's Megatron-Core/NeMo and the
stacks read as it), ``megatron_2022`` (the 2021-22 Megatron-LM of Narayanan et al. 2021 and Korthikanti et al.
2022, ``models.core.params.MEGATRON_2022``) and ``pytorch_native`` (stacks whose kernels are PyTorch's own; the
same physics with its own fitted kernel efficiency). A fit may carry values fitted for one preset only.
"""

from __future__ import annotations

import functools

import polars as pl

from models.core.params import DEFAULT, MEGATRON_2022

PRESETS = ("default", "megatron_2022", "pytorch_native")


def preset_params(name: str, base=None, overrides=None):
    """The PhysParams of a software preset (`base` overrides DEFAULT, e.g. with fitted values; `overrides`
    {preset: {field: value}} are values fitted for one preset only, e.g. its host overhead per op)."""
    base = base or DEFAULT
    extra = dict((overrides or {}).get(name, {}))
    if name == "default":
        return base.with_(**extra) if extra else base
    if name == "pytorch_native":  # the reference physics; only its fitted kernel efficiency differs
        return base.with_(**extra) if extra else base
    if name == "megatron_2022":
        return base.with_(**(_megatron_2022_diff() | extra))
    raise ValueError(f"unknown software preset {name!r}; expected one of {PRESETS}")


@functools.cache
def _megatron_2022_diff() -> dict:
    """The fields MEGATRON_2022 changes from DEFAULT (both constants: computed once; a fit calls
    `preset_params` for every physics evaluation)."""
    prior = DEFAULT.to_dict()
    return {k: v for k, v in MEGATRON_2022.to_dict().items() if prior[k] != v}


def predict_by_preset(configs: pl.DataFrame, predict, base=None, overrides=None) -> pl.DataFrame:
    """Predict each row with the PhysParams of its `software_preset` (row order kept)."""
    if "software_preset" not in configs.columns:
        return predict(configs, preset_params("default", base, overrides))
    idx = configs.with_row_index("_i")
    parts = []
    for name in PRESETS:
        sub = idx.filter(pl.col("software_preset") == name)
        if sub.height:
            parts.append(sub.select("_i").hstack(predict(sub.drop("_i"), preset_params(name, base, overrides))))
    return pl.concat(parts, how="diagonal_relaxed").sort("_i").drop("_i")
