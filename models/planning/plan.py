"""Planning arithmetic: reliability-aware time-to-train, energy, cost, and compute-optimal sizing (pure, vectorized).

Everything here works on numpy arrays (one element per candidate option) so that a plan over
hardware x cluster size x layout is a handful of array operations.

Reliability (why returns diminish at scale even with perfect scaling)
--------------------------------------------------------------------
Interruptions arrive at a rate proportional to the number of accelerators: a job on N accelerators sees a mean
time between interruptions M = 1 / (lambda * N). The job checkpoints every tau seconds (a write takes delta),
and each interruption costs a restart R plus the work since the last checkpoint (tau/2 on average, plus half a
checkpoint write). With Young's/Daly's first-order optimum tau = sqrt(2 * delta * M) (Young 1974; Daly 2006),
the expected wall-clock time to finish T_ideal of failure-free training is

    T_wall = T_ideal * (1 + delta / tau) / (1 - (R + (tau + delta) / 2) / M)

and goodput = T_ideal / T_wall. When the denominator reaches 0 the job cannot make progress at that scale.

Constants and their sources
---------------------------
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from models.core.params import DEFAULT
from models.planning.curves import batch_tokens
from models.planning.search import search

HOURS_PER_DAY = 24.0
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class ReliabilityParams:
    # Unexpected job interruptions per accelerator-hour. Dubey et al. 2024 ("The Llama 3 Herd of Models",
    # section 3.3.4): 419 unexpected interruptions in a 54-day snapshot on 16,384 H100 GPUs
    # -> 419 / (16,384 x 54 x 24 h) = 1.97e-5 per GPU-hour (one every ~3.1 h at that scale).
    failures_per_gpu_hour: float = 419.0 / (16_384 * 54 * 24)
    # Checkpoint bytes per parameter: bf16 weights (2) + fp32 master weights, Adam m and v (12)
    # (mixed-precision Adam state, Rajbhandari et al. 2020 section 3.1); gradients are not checkpointed.
    checkpoint_bytes_per_param: float = 14.0
    # Aggregate storage write bandwidth, bytes/s. Dubey et al. 2024 section 3.3.1: Meta's Tectonic storage for
    # Llama 3 sustains 2 TB/s (peaks at 7 TB/s). Change it to your storage's figure.
    storage_write_bytes_per_s: float = 2e12
    # Restart after an interruption (rescheduling, NCCL initialisation, checkpoint load), seconds. A prior:
    # Llama 3 kept > 90 % effective training time over 419 interruptions in 54 days, i.e. at most
    # 0.1 x 54 d / 419 = 18.6 min lost per interruption including the rolled-back work; 10 min for the restart.
    restart_s: float = 600.0
    # Power usage effectiveness of the data centre: Google's fleet-wide trailing-twelve-month PUE of 1.10
    # (Google 2024 Environmental Report). Energy counts accelerator TDP x PUE (hosts and network not included).
    pue: float = 1.10

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


RELIABILITY = ReliabilityParams()
__doc__ += "\n".join(f"- `{k}` = {v:g}" for k, v in RELIABILITY.to_dict().items())


def reliability(ideal_s, n_gpus, params, rp: ReliabilityParams = RELIABILITY) -> dict[str, np.ndarray]:
    """Wall-clock time with interruptions, checkpoints and restarts for `ideal_s` seconds of training.

    Returns arrays: mtbf_s (job mean time between interruptions), checkpoint_write_s, checkpoint_interval_s,
    expected_interruptions, wall_s (inf where the job cannot progress), goodput (ideal / wall)."""
    ideal = np.asarray(ideal_s, dtype=np.float64)
    n = np.asarray(n_gpus, dtype=np.float64)
    p = np.asarray(params, dtype=np.float64)
    mtbf = 1.0 / (rp.failures_per_gpu_hour * n) * SECONDS_PER_HOUR
    delta = p * rp.checkpoint_bytes_per_param / rp.storage_write_bytes_per_s
    tau = np.sqrt(2.0 * delta * mtbf)
    lost_fraction = (rp.restart_s + (tau + delta) / 2.0) / mtbf
    with np.errstate(divide="ignore", invalid="ignore"):
        wall = np.where(lost_fraction < 1.0, ideal * (1.0 + delta / tau) / (1.0 - lost_fraction), np.inf)
    return {
        "mtbf_s": mtbf,
        "checkpoint_write_s": delta,
        "checkpoint_interval_s": tau,
        "expected_interruptions": np.where(np.isfinite(wall), wall / mtbf, np.inf),
        "wall_s": wall,
        "goodput": np.where(np.isfinite(wall), ideal / wall, 0.0),
    }


def energy_mwh(n_gpus, tdp_w, wall_s, pue: float = RELIABILITY.pue) -> np.ndarray:
    """Facility energy in MWh: accelerators at TDP for the wall-clock time, times PUE (an upper bound for the
    accelerators, a lower bound for the facility since hosts and network are not counted)."""
    return np.asarray(n_gpus, float) * np.asarray(tdp_w, float) * np.asarray(wall_s, float) * pue / 3.6e9


# ------------------------------------------------------------------ compute-optimal sizing

@dataclass(frozen=True)
class ScalingLaw:
    """Chinchilla parametric loss L(N, D) = E + A / N^alpha + B / D^beta (Hoffmann et al. 2022, Approach 3,
    equation 10 and section D.2: E = 1.69, A = 406.4, B = 410.7, alpha = 0.34, beta = 0.28), N parameters,
    D training tokens, training compute C = 6 N D."""

    E: float = 1.69
    A: float = 406.4
    B: float = 410.7
    alpha: float = 0.34
    beta: float = 0.28

    def loss(self, n_params, tokens) -> np.ndarray:
        n = np.asarray(n_params, float)
        d = np.asarray(tokens, float)
        return self.E + self.A / n**self.alpha + self.B / d**self.beta

    def optimal(self, compute_flop) -> tuple[np.ndarray, np.ndarray]:
        """Compute-optimal (params, tokens) for training compute C (closed form of Hoffmann et al. eq. 4):
        N_opt = G (C/6)^a, D_opt = G^-1 (C/6)^b, a = beta/(alpha+beta), b = alpha/(alpha+beta),
        G = (alpha A / (beta B))^(1/(alpha+beta))."""
        c = np.asarray(compute_flop, float) / 6.0
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))
        a = self.beta / (self.alpha + self.beta)
        b = self.alpha / (self.alpha + self.beta)
        return g * c**a, c**b / g


CHINCHILLA = ScalingLaw()


def dense_shape(n_params) -> dict[str, np.ndarray]:
    """A GPT-style dense architecture with about `n_params` parameters.

    Rule (documented, not fitted): width/depth ratio d_model = 128 x n_layers, the aspect ratio of GPT-3 175B
    (12,288 / 96; Kaplan et al. 2020 found loss flat for d_model/n_layers between ~50 and ~200), head size 128,
    d_model rounded to a multiple of 128, 4 x d_model GELU MLP, 51,200-token vocabulary (GPT-2 BPE padded),
    untied embeddings. Non-embedding parameters 12 x n_layers x d_model^2 solve for n_layers."""
    p = np.maximum(np.asarray(n_params, float), 1e6)
    layers = np.maximum(np.round(np.cbrt(p / (12.0 * 128.0**2))), 2.0)
    d = np.maximum(np.round(128.0 * layers / 128.0) * 128.0, 128.0)
    return {
        "n_layers": layers,
        "d_model": d,
        "n_heads": d / 128.0,
        "n_kv_heads": d / 128.0,
        "ffn_dim": 4.0 * d,
        "vocab": np.full_like(d, 51200.0),
    }


# ------------------------------------------------------------------ options: hardware x cluster size x layout

#: the layout grid a plan searches at each cluster size (a subset of `models.planning.search`'s full grid, chosen so a
#: plan over ~16 accelerators x ~14 sizes stays around a second): micro-batch 1-2, interleave 1/2/4,
#: ZeRO-1 or FSDP, every recompute mode, context parallel up to 2
PLAN_GRID = {"micro_batch": [1, 2], "vpp": [1, 2, 4], "sharding": ["zero1", "fsdp"],
             "recompute": ["none", "selective", "full"], "cp": [1, 2]}


def cluster_sizes(scaleup_size: int, max_gpus: int, min_gpus: int | None = None) -> list[int]:
    """Node-aligned cluster sizes: one scale-up domain times powers of two, up to max_gpus."""
    node = max(int(scaleup_size or 8), 1)
    sizes, n = [], node
    while n <= max_gpus:
        if min_gpus is None or n >= min_gpus:
            sizes.append(n)
        n *= 2
    return sizes


def best_layouts(arch: dict, hardware_rows: list[dict], tokens_per_step_seqs: int, seq_len: int, max_gpus: int,
                 dtype: str = "bf16", params=None, grid: dict | None = None, search_fn=None) -> list[dict]:
    """The best feasible layout (by throughput) for every hardware x node-aligned cluster size.

    Returns a list of dicts with hardware, n_gpus, the layout, tokens_per_s_per_gpu, mfu, step_time_s, params
    and the step-time breakdown; sizes with no feasible layout are skipped."""
    search_fn = search_fn or search
    params = DEFAULT if params is None else params
    out: list[dict] = []
    for hw in hardware_rows:
        for n in cluster_sizes(hw.get("scaleup_size") or 8, max_gpus):
            res = search_fn(arch, hw, n, tokens_per_step_seqs, seq_len, fixed=grid or PLAN_GRID, dtype=dtype,
                            top_k=1, params=params)
            if res.height == 0:
                continue
            row = res.row(0, named=True)
            row.update(hardware=hw["id"], n_gpus=n)
            out.append(row)
    return out


def plan_rows(arch: dict, hardware_rows: list[dict], tokens: float, tokens_per_step_seqs: int, seq_len: int,
              max_gpus: int, usd_per_gpu_hour: dict, dtype: str = "bf16", model=None, grid: dict | None = None,
              rows: list[dict] | None = None):
    """Every accelerator x cluster size with its best layout under `model` (`models.fitting.predictor`: the one
    prediction function; ranking, throughput, MFU and interval all come from it), and the days, dollars and
    energy that follow from that one step time (`days_lo`/`days_hi` from the interval's throughput).
    `stepcast plan` and the `hardware_choice` table both call this. Returns a polars DataFrame. ``rows``: the
    result of `best_layouts` for these arguments when the caller computed it already (the `hardware_choice` asset
    runs it per accelerator in worker processes and passes the rows on in ``hardware_rows``' order)."""
    import polars as pl

    if rows is None:
        rows = best_layouts(arch, hardware_rows, tokens_per_step_seqs, seq_len, max_gpus, dtype=dtype, params=model,
                            grid=grid)
    if not rows:
        return pl.DataFrame()
    f = pl.DataFrame(rows, infer_schema_length=None)
    tdp_by_id = {r["id"]: r.get("tdp_w") for r in hardware_rows}
    price = np.array([usd_per_gpu_hour[h] for h in f["hardware"]], dtype=float)
    tdp = np.array([tdp_by_id.get(h) or np.nan for h in f["hardware"]], dtype=float)
    n = f["n_gpus"].to_numpy().astype(float)
    par = f["params"].to_numpy()
    mid = time_and_cost(tokens, n, f["tokens_per_s_per_gpu"].to_numpy(), par, price, tdp)
    slow = time_and_cost(tokens, n, f["tokens_per_s_per_gpu_lo"].to_numpy(), par, price, tdp)
    fast = time_and_cost(tokens, n, f["tokens_per_s_per_gpu_hi"].to_numpy(), par, price, tdp)
    f = f.with_columns(
        pl.Series("usd_per_gpu_hour", price), *[pl.Series(k, v) for k, v in mid.items()],
        pl.Series("days_lo", fast["days"]), pl.Series("days_hi", slow["days"]),
        pl.Series("cost_usd_lo", fast["cost_usd"]), pl.Series("cost_usd_hi", slow["cost_usd"]),
    ).filter(pl.col("days").is_finite())
    return batch_caps(f, tokens_per_step_seqs, seq_len, tokens)


#: micro-batches per pipeline stage in each data-parallel replica that a layout needs to keep its bubble small: one,
#: as Llama 3 405B trained on 16,384 H100 (Dubey et al. 2024, Table 4: pp 16, 16 sequences per DP replica)
MICROBATCHES_PER_STAGE = 1


def batch_caps(frame, tokens_per_step_seqs: int, seq_len: int, tokens: float):
    """Where the global batch caps data parallelism, per row of `plan_rows`.

    Each accelerator's reference is its row of the best MFU (its layout: model-parallel size m = tp x pp x cp,
    pp, micro-batch). The batch feeds at most seqs / (pp x micro-batch x MICROBATCHES_PER_STAGE) replicas of that
    layout; a cluster of N needs N / m of them. Where it needs more, the extra accelerators can only go to tp, pp
    and cp (or leave fewer micro-batches than stages) and MFU falls: `batch_capped`, the batch that would use the
    cluster with the reference layout (`batch_tokens_to_fill` = N / m x pp x micro-batch x seq_len), and
    `batch_note`, which also gives the DeepSeek LLM critical batch for the run's compute
    (models.planning.curves.batch_tokens: beyond it the loss per token rises)."""
    import polars as pl

    if frame.height == 0:
        return frame.with_columns(pl.lit(None, dtype=pl.Boolean).alias("batch_capped"),
                                  pl.lit(None, dtype=pl.Float64).alias("batch_tokens_to_fill"),
                                  pl.lit(None, dtype=pl.Utf8).alias("batch_note"))
    capped, fill, notes = [], [], []
    refs = {}
    for r in frame.sort(["hardware", "mfu", "n_gpus"], descending=[False, True, False]).iter_rows(named=True):
        refs.setdefault(r["hardware"], r)
    seqs = int(tokens_per_step_seqs)
    for r in frame.iter_rows(named=True):
        ref = refs[r["hardware"]]
        m_ref = int(ref["tp"]) * int(ref["pp"]) * int(ref["cp"])
        per_replica = int(ref["pp"]) * int(ref["micro_batch"]) * MICROBATCHES_PER_STAGE
        dp_fed = max(seqs // per_replica, 1)
        dp_wanted = int(r["n_gpus"]) // m_ref
        if dp_wanted <= dp_fed or r["mfu"] >= ref["mfu"]:
            capped.append(False)
            fill.append(None)
            notes.append(None)
            continue
        need_seqs = dp_wanted * per_replica
        m = int(r["tp"]) * int(r["pp"]) * int(r["cp"])
        crit = float(batch_tokens(6.0 * float(r["params"]) * float(tokens)))
        where = (f"the extra accelerators go to tp x pp x cp ({r['tp']} x {r['pp']} x {r['cp']} = {m:,}, dp "
                 f"{r['dp']})" if m > m_ref else
                 f"each replica gets fewer than {MICROBATCHES_PER_STAGE} micro-batch per pipeline stage")
        capped.append(True)
        fill.append(float(need_seqs * seq_len))
        notes.append(
            f"the global batch caps data parallelism: {seqs * seq_len:,} tokens ({seqs:,} sequences of {seq_len:,}) "
            f"feed at most {dp_fed:,} replicas of the layout of the best MFU ({ref['mfu']:.2f} on "
            f"{ref['n_gpus']:,} {r['hardware']}: tp {ref['tp']} x pp {ref['pp']} x cp {ref['cp']}, micro-batch "
            f"{ref['micro_batch']}, {MICROBATCHES_PER_STAGE} micro-batch per stage); {r['n_gpus']:,} would need "
            f"{dp_wanted:,}, so {where} and MFU falls to {r['mfu']:.2f}. A batch of {need_seqs:,} sequences "
            f"({need_seqs * seq_len / 1e6:,.1f}M tokens, --global-batch-tokens {need_seqs * seq_len}) would use the "
            f"cluster (the DeepSeek LLM critical batch for this compute is {crit / 1e6:,.1f}M tokens; beyond it the "
            "loss per token rises)")
    return frame.with_columns(pl.Series("batch_capped", capped, dtype=pl.Boolean),
                              pl.Series("batch_tokens_to_fill", fill, dtype=pl.Float64),
                              pl.Series("batch_note", notes, dtype=pl.Utf8))


def time_and_cost(tokens: float, n_gpus, tokens_per_s_per_gpu, params, usd_per_gpu_hour, tdp_w,
                  rp: ReliabilityParams = RELIABILITY) -> dict[str, np.ndarray]:
    """Days, dollars and energy to train `tokens`, ideal (no interruptions) and with reliability losses."""
    n = np.asarray(n_gpus, float)
    tput = np.asarray(tokens_per_s_per_gpu, float)
    ideal_s = tokens / (tput * n)
    rel = reliability(ideal_s, n, params, rp)
    wall = rel["wall_s"]
    price = np.asarray(usd_per_gpu_hour, float)
    return {
        "days_ideal": ideal_s / 86400.0,
        "days": wall / 86400.0,
        "goodput": rel["goodput"],
        "expected_interruptions": rel["expected_interruptions"],
        "checkpoint_interval_min": rel["checkpoint_interval_s"] / 60.0,
        "checkpoint_write_s": rel["checkpoint_write_s"],
        "mtbf_h": rel["mtbf_s"] / 3600.0,
        "cost_usd": n * price * wall / 3600.0,
        "cost_usd_ideal": n * price * ideal_s / 3600.0,
        "energy_mwh": energy_mwh(n, tdp_w, wall, rp.pue),
    }
