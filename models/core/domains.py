"""Calibration domains: which hardware generation, precision, architecture family and software era a
configuration belongs to (pure, vectorized).

A fitted parameter means something only inside the conditions it was fitted on. A fit records the domain
of its training runs (`Domain`); a configuration is *inside* when its hardware generation, precision family
and software era were all seen in training, else *extrapolated* (and the prediction says why). The same
groupings define the transfer protocols of the calibration (leave one generation / family / precision out).

Hardware generation is the vendor's architecture name, the hardware table's `generation` column
(measurements/hardware_specs.csv: Fermi, Kepler, Pascal, Volta, Turing, Ampere, Ada, Hopper, Blackwell, CDNA and
CDNA2-4, Gaudi2/3, TPUv2-TPUv7, Trainium). The groups used for domains and protocols are the issue's "hardware
generations": pre-Ampere NVIDIA, Ampere, Ada, Hopper, Blackwell, AMD, Gaudi, TPU. A generation `GENERATION_GROUP`
does not list (a new part's) is `unknown`: no fit has seen it, so its predictions are extrapolated and say so.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import polars as pl

#: generation -> group used by the domains and the leave-one-generation-out protocol
GENERATION_GROUP = {
    "Fermi": "pre-Ampere", "Kepler": "pre-Ampere", "Maxwell": "pre-Ampere", "Pascal": "pre-Ampere",
    "Volta": "pre-Ampere", "Turing": "pre-Ampere", "Ampere": "Ampere", "Ada": "Ada", "Hopper": "Hopper",
    "Blackwell": "Blackwell", "CDNA": "AMD", "CDNA2": "AMD", "CDNA3": "AMD", "CDNA4": "AMD", "Gaudi2": "Gaudi",
    "Gaudi3": "Gaudi", "TPUv2": "TPU", "TPUv3": "TPU", "TPUv4": "TPU", "TPUv5e": "TPU", "TPUv5p": "TPU",
    "TPUv6e": "TPU", "TPUv7": "TPU",
}
GENERATION_GROUPS = ("pre-Ampere", "Ampere", "Ada", "Hopper", "Blackwell", "AMD", "Gaudi", "TPU", "unknown")
#: precision (dtype) -> family used by the domains and the leave-one-precision-out protocol
PRECISION_FAMILY = {"bf16": "16-bit", "fp16": "16-bit", "fp32": "32-bit", "tf32": "32-bit", "fp8": "fp8",
                    "fp8-cs": "fp8", "mxfp8": "fp8", "nvfp4": "fp4"}
PRECISION_FAMILIES = ("16-bit", "32-bit", "fp8", "fp4")
#: dtype code (models.core.params.DTYPE_CODES order) -> precision family index in PRECISION_FAMILIES
PRECISION_FAMILY_OF_CODE = np.array([0, 0, 2, 2, 2, 3, 1, 1])
SOFTWARE_ERAS = ("default", "megatron_2022", "pytorch_native")
ARCH_FAMILIES = ("dense", "moe", "hybrid")


def generation_group(generation: str | None) -> str:
    """The group of a hardware generation (the hardware table's `generation`); 'unknown' for one the groups do not
    list or none."""
    return GENERATION_GROUP.get(generation, "unknown") if generation else "unknown"


def hardware_key(hw_id) -> str:
    """The normalized hardware id a domain records (lower case, stripped)."""
    return str(hw_id or "").strip().lower()


def hardware_code(hw_id) -> float:
    """A stable numeric code of a hardware id for the model arrays (CRC-32 of ``hardware_key``, exact in float64;
    NaN for no id): the same id gets the same code in every session, so a stored fit's domain can be compared with
    the rows of any later command."""
    key = hardware_key(hw_id)
    return float(zlib.crc32(key.encode())) if key else float("nan")


def generation_group_code(generation: str | None) -> int:
    """`generation_group` as its index in GENERATION_GROUPS (the model arrays' ``generation_code``)."""
    return GENERATION_GROUPS.index(generation_group(generation))


def generation_groups(hw_ids: pl.Series, generations: pl.Series | None = None) -> np.ndarray:
    """`generation_group` of each row (object array of group names): `generations` is the rows' hardware
    `generation` column, `hw_ids` their hardware ids (one row each; without `generations` every row is 'unknown')."""
    gens = generations.to_list() if generations is not None else [None] * len(hw_ids)
    groups = {g: generation_group(g) for g in set(gens)}
    return np.array([groups[g] for g in gens], dtype=object)


def arch_family(n_experts, n_mamba_layers=None) -> np.ndarray:
    """'hybrid' when the model has state-space (Mamba) layers, else 'moe' with routed experts, else 'dense'."""
    e = np.nan_to_num(np.asarray(n_experts, dtype=float))
    m = np.zeros_like(e) if n_mamba_layers is None else np.nan_to_num(np.asarray(n_mamba_layers, dtype=float))
    return np.where(m > 0, "hybrid", np.where(e > 0, "moe", "dense")).astype(object)


def precision_family(dtypes) -> np.ndarray:
    return np.array([PRECISION_FAMILY.get(str(d).lower() if d is not None else "bf16", "unknown")
                     for d in dtypes], dtype=object)


@dataclass(frozen=True)
class Domain:
    """What a fit saw: generation groups, precision families, software eras, the largest cluster, and the hardware
    models (ids) its runs measured, each with the generation group its runs were labelled with (`hardware_groups`).
    A configuration on a hardware model the fit never measured, of a generation it did, keeps the fitted parameters
    but takes the wider interval (models.fitting.predictor DOMAIN_NEW_HARDWARE): a part's own clocks, power limit
    and special-function units are not all in its spec row. Fits stored before the hardware field existed record no
    hardware and treat every model as seen."""

    generations: tuple = ()
    precisions: tuple = ()
    eras: tuple = ()
    max_n_gpus: float = 0.0
    families: tuple = field(default=())
    hardware: tuple = field(default=())
    hardware_groups: tuple = field(default=())  # (hardware id, generation group) pairs of the fit's runs

    @classmethod
    def of(cls, generations, precisions, eras, n_gpus, families=(), hardware=()) -> "Domain":
        """From the fit's runs: `generations` (groups), `precisions`, `eras`, `n_gpus`, `families` and `hardware`
        (ids) one per run; a hardware id's group is the generation of its runs."""
        keys = [hardware_key(h) for h in hardware]
        pairs = {(k, str(g)) for k, g in zip(keys, generations) if k not in ("", "?")} \
            if len(keys) == len(generations) else set()
        return cls(tuple(sorted(set(map(str, generations)))), tuple(sorted(set(map(str, precisions)))),
                   tuple(sorted(set(map(str, eras)))), float(np.nanmax(n_gpus)) if len(n_gpus) else 0.0,
                   tuple(sorted(set(map(str, families)))),
                   tuple(sorted({k for k in keys if k not in ("", "?")})), tuple(sorted(pairs)))

    def hardware_seen(self, codes) -> np.ndarray:
        """Row-wise: the hardware model (``hardware_code``) was measured in the fit; True where the row has no code
        or the fit recorded no hardware (a fit stored before the field existed)."""
        codes = np.asarray(codes, dtype=np.float64)
        seen_ids = getattr(self, "hardware", ())
        if not seen_ids:
            return np.ones(codes.shape, dtype=bool)
        out = np.isnan(codes)
        for h in seen_ids:  # a few ids: equality tests beat np.isin at the search's block sizes (models.core.fastops)
            out |= codes == hardware_code(h)
        return out

    def hardware_of_group(self, group: str) -> list[str]:
        """The hardware models of one generation group the fit measured."""
        pairs = set(getattr(self, "hardware_groups", ()))
        return [h for h in getattr(self, "hardware", ()) if (h, group) in pairs]

    def codes(self):
        """Boolean lookup tables over GENERATION_GROUPS / PRECISION_FAMILIES / SOFTWARE_ERAS."""
        g = np.array([x in self.generations for x in GENERATION_GROUPS])
        p = np.array([x in self.precisions for x in PRECISION_FAMILIES])
        e = np.array([x in self.eras for x in SOFTWARE_ERAS])
        return g, p, e

    def inside(self, gen_code: np.ndarray, dtype_code: np.ndarray, era_code: np.ndarray) -> np.ndarray:
        """Row-wise: generation group, precision family and software era all seen by the fit."""
        g, p, e = self.codes()
        gc = np.clip(np.asarray(gen_code, dtype=np.int64), 0, len(GENERATION_GROUPS) - 1)
        pc = PRECISION_FAMILY_OF_CODE[np.clip(np.asarray(dtype_code, dtype=np.int64), 0, 7)]
        ec = np.clip(np.asarray(era_code, dtype=np.int64), 0, len(SOFTWARE_ERAS) - 1)
        return g[gc] & p[pc] & e[ec]

    def explain(self, gen_code: int, dtype_code: int, era_code: int) -> str:
        """'inside', or 'extrapolated: ...' naming what the fit did not see."""
        why = []
        gen = GENERATION_GROUPS[int(np.clip(gen_code, 0, len(GENERATION_GROUPS) - 1))]
        if gen not in self.generations:
            why.append(f"hardware generation {gen} not in the fit ({', '.join(self.generations)})")
        prec = PRECISION_FAMILIES[int(PRECISION_FAMILY_OF_CODE[int(np.clip(dtype_code, 0, 7))])]
        if prec not in self.precisions:
            why.append(f"precision {prec} not in the fit ({', '.join(self.precisions)})")
        era = SOFTWARE_ERAS[int(np.clip(era_code, 0, len(SOFTWARE_ERAS) - 1))]
        if era not in self.eras:
            why.append(f"software era {era} not in the fit ({', '.join(self.eras)})")
        return "inside" if not why else "extrapolated: " + "; ".join(why)

    def to_dict(self) -> dict:
        return {"generations": list(self.generations), "precisions": list(self.precisions), "eras": list(self.eras),
                "max_n_gpus": self.max_n_gpus, "families": list(self.families),
                "hardware": list(getattr(self, "hardware", ())),
                "hardware_groups": [list(p) for p in getattr(self, "hardware_groups", ())]}
