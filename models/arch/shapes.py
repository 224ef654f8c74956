"""A dense GPT-style shape for a parameter count (pure, vectorized): the rule the frontier sizes a model by and the
corpus reader uses to complete a dense run that states only its size.

The rule: aspect ratio d_model / n_layers within Kaplan et al. 2020's flat optimum around GPT-3's 128 (Brown et
al. 2020), the head count the power of two nearest d_model / 128, a GeLU MLP of 4 d_model, tied embeddings and
the GPT-2 vocabulary padded as Megatron-LM pads it. Stated fields of a request are kept; the rule chooses the rest,
and the shape whose parameter count (models.arch.accounting) is closest in log to the request's answers.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from models.arch.accounting import param_counts

ASPECT = 128  # d_model / n_layers (GPT-3 175B, Brown et al. 2020)
ASPECTS = (108.0, 118.0, 128.0, 139.0, 152.0)  # within Kaplan et al. 2020 Fig. 5's flat optimum
HEAD_DIMS = tuple(range(96, 177, 8))  # d_model / heads, heads the power of two nearest d_model / 128
VOCAB = 51_200  # GPT-2 BPE padded to a multiple of 1024 (Megatron-LM default)


def gpt_shape(d: np.ndarray, layers: np.ndarray, heads: np.ndarray) -> dict[str, np.ndarray]:
    """The rule's dense shape for each (d_model, n_layers, n_heads): the architecture columns models.arch.accounting reads."""
    d = np.asarray(d, dtype=np.float64)
    z = np.zeros_like(d)
    return {"n_layers": np.asarray(layers, dtype=np.float64), "d_model": d, "n_heads": np.asarray(heads, float),
            "n_kv_heads": np.asarray(heads, float), "head_dim": d / heads, "ffn_dim": 4.0 * d,
            "vocab": np.full_like(d, VOCAB), "activation": z, "n_experts": z, "top_k": z, "expert_ffn_dim": 4.0 * d,
            "n_shared_experts": z, "n_dense_layers": z, "tied_embeddings": np.ones_like(d)}


def _candidates() -> dict[str, np.ndarray]:
    """Every shape of the rule (module docstring), d_model up to ~2^21."""
    heads = 2.0 ** np.arange(0, 15)
    hd = np.asarray(HEAD_DIMS, dtype=np.float64)
    d = (heads[:, None] * hd[None, :]).ravel()
    h = np.repeat(heads, len(hd))
    near = 2.0 ** np.round(np.log2(d / 128.0))
    keep = (near == h) | ((h == 1) & (d < 128.0))
    d, h = d[keep], h[keep]
    a = np.asarray(ASPECTS)
    layers = np.maximum(np.round(d[:, None] / a[None, :]), 1.0).ravel()
    d = np.repeat(d, len(a))
    h = np.repeat(h, len(a))
    shp = gpt_shape(d, layers, h)
    shp["params"] = param_counts(shp)["params"]
    return shp


_CAND = _candidates()


def dense_shapes_for_params(params: np.ndarray, vocab: np.ndarray | None = None, n_layers: np.ndarray | None = None,
                            d_model: np.ndarray | None = None, n_heads: np.ndarray | None = None
                            ) -> dict[str, np.ndarray]:
    """Per element of ``params`` (parameters), the shape of the rule (module docstring) whose parameter
    count (models.arch.accounting) is closest in log to it: columns of ``_shape`` (n_layers, d_model, n_heads, ...) and
    ``params``, the count. The stated ``vocab``, ``n_layers``, ``d_model``, ``n_heads`` of an element (NaN: not
    stated; vocab then ``VOCAB``) replace the rule's in every shape before counting, so they are kept and the rule
    chooses the rest."""
    t = np.atleast_1d(np.asarray(params, dtype=np.float64))

    def stated(x) -> np.ndarray:
        return np.full(t.size, np.nan) if x is None else np.broadcast_to(np.asarray(x, dtype=np.float64), t.shape)

    given = np.column_stack([t, stated(vocab), stated(n_layers), stated(d_model), stated(n_heads)])
    rows, back = np.unique(given, axis=0, return_inverse=True)  # one search per distinct request
    back = np.ravel(back)

    def grid(col: int, key: str) -> np.ndarray:  # (requests, shapes): the stated value, else the rule's
        x = rows[:, col][:, None]
        return np.where(np.isnan(x), _CAND[key][None, :], x).ravel()

    shp = gpt_shape(grid(3, "d_model"), grid(2, "n_layers"), grid(4, "n_heads"))
    shp["vocab"] = np.repeat(np.nan_to_num(rows[:, 1], nan=float(VOCAB)), _CAND["d_model"].size)
    shp["params"] = param_counts(shp)["params"]
    counted = shp["params"].reshape(len(rows), -1)
    i = np.argmin(np.abs(np.log(counted) - np.log(np.maximum(rows[:, 0], 1.0))[:, None]), axis=1)
    pick = np.arange(len(rows)) * counted.shape[1] + i
    return {k: a[pick][back] for k, a in shp.items()}


def dense_arch_for_params(target_params: float) -> dict[str, Any]:
    """The dense GPT-style architecture (module docstring) closest to ``target_params``."""
    return dict(_dense_arch_for_params(float(target_params)))  # a new dict: the caller may change it


@functools.lru_cache(maxsize=4096)
def _dense_arch_for_params(target_params: float) -> dict[str, Any]:
    """`dense_arch_for_params`, once per size (every frontier sweep asks for the same grid of sizes)."""
    shp = dense_shapes_for_params(np.array([target_params]))
    d, L, h = int(shp["d_model"][0]), int(shp["n_layers"][0]), int(shp["n_heads"][0])
    return {"id": f"dense-{d}x{L}", "n_layers": L, "d_model": d, "n_heads": h, "n_kv_heads": h,
            "head_dim": d // h, "ffn_dim": 4 * d, "vocab": VOCAB, "activation": "gelu", "n_experts": 0, "top_k": 0,
            "expert_ffn_dim": 4 * d, "n_shared_experts": 0, "n_dense_layers": 0, "tied_embeddings": True,
            "params": float(shp["params"][0])}
