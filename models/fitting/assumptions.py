"""Two sets of assumptions behind every frontier and curve: ``ideal`` and ``realistic``.

``realistic`` is the calibrated model: the physical parameters the caller passes (the promoted fit's, or the
priors of ``models.core.params.DEFAULT``) are used unchanged.

``ideal`` is Epoch AI's "ideal conditions" (Erdil & Schneider-Joseph 2024, "Data movement limits to frontier
model training", arXiv:2411.01137; the Distributed Training Interactive Simulator, epoch.ai/tools/distributed-
training: "we assume that hardware in the training cluster never fails and all operations are always completed
synchronously"). Their model charges a training step only for data movement and arithmetic at the hardware's
datasheet rates, plus latency; so here:

* perfect compute/communication overlap where the schedule allows it: ``tp_overlap``, ``dp_overlap``,
  ``fsdp_gather_overlap``, ``ep_overlap``, ``pp_overlap`` = 1 (``models.physics.step_time`` hides traffic behind the
  micro-batch's compute, never more than that compute, so the excess stays exposed);
* no host (CPU dispatch) overhead: ``host_overhead_s_per_op`` = 0;
* no GEMM-size ramp: ``gemm_ramp_flops_per_sm`` (earlier ``gemm_half_flops``; any ``gemm_ramp*`` or
  ``gemm_half*`` field) = 0;
* arithmetic at the datasheet peak: ``matmul_eff_*`` and ``attn_eff`` = 1. Choice: Epoch's model divides
  FLOPs by the hardware's peak FLOP/s (a roofline against the memory traffic, whose bandwidth is also the
  datasheet one), i.e. matmuls run at 100 % of peak once they are large enough; the losses it reports come from
  data movement and latency only. Likewise the datasheet bandwidths of memory and links are reached:
  ``hbm_eff``, ``scaleup_eff``, ``pcie_eff`` (the PCIe/host tier's), ``scaleout_eff`` = 1. Every counted FLOP is charged at that peak, the causal
  attention square included (``attn_causal_work_fraction`` = 1), so utilization (MFU) never exceeds 1;
* no memory allowance beyond weights, gradients, optimizer state and activations: ``mem_overhead_gb`` = 0,
  ``mem_fragmentation_frac`` = 0;
* no stragglers or jitter (every accelerator as fast as the datasheet, so no step waits for the slowest):
  ``straggler_cv`` = 0;
* latency stays: ``alpha_scaleup_s``, ``alpha_pcie_s`` and ``alpha_scaleout_s`` (per collective step) keep the
  caller's values.

Fields are set by introspection of ``PhysParams``: a field that does not exist is skipped, so the module works
before and after a field is renamed.
"""

from __future__ import annotations

from dataclasses import fields

from models.core.params import PhysParams

ASSUMPTIONS = ("ideal", "realistic")
DEFAULT_ASSUMPTIONS = "realistic"

# field name -> value under 'ideal' (module docstring); absent fields are skipped
IDEAL_VALUES: dict[str, float] = {
    "tp_overlap": 1.0, "dp_overlap": 1.0, "fsdp_gather_overlap": 1.0, "ep_overlap": 1.0, "pp_overlap": 1.0,
    "host_overhead_s_per_op": 0.0,
    "gemm_half_flops": 0.0, "gemm_ramp_s": 0.0, "gemm_ramp_flops_per_sm": 0.0,
    "matmul_eff_16bit": 1.0, "matmul_eff_8bit": 1.0, "matmul_eff_32bit": 1.0, "attn_eff": 1.0,
    "attn_causal_work_fraction": 1.0,
    "hbm_eff": 1.0, "scaleup_eff": 1.0, "pcie_eff": 1.0, "scaleout_eff": 1.0,
    "mem_overhead_gb": 0.0, "mem_fragmentation_frac": 0.0, "straggler_cv": 0.0,
}


def check_assumptions(assumptions: str) -> str:
    """The name itself, or ValueError listing the choices."""
    if assumptions not in ASSUMPTIONS:
        raise ValueError(f"assumptions must be one of {', '.join(ASSUMPTIONS)}, got '{assumptions}'")
    return assumptions


def params_for(assumptions: str, params: PhysParams) -> PhysParams:
    """The physical parameters under ``assumptions`` (module docstring): ``realistic`` -> ``params`` unchanged,
    ``ideal`` -> ``params`` with Epoch's ideal conditions applied."""
    if check_assumptions(assumptions) == "realistic":
        return params
    names = {f.name for f in fields(PhysParams)}
    ramp = {k: 0.0 for k in names if k.startswith(("gemm_ramp", "gemm_half"))}
    return params.with_(**(ramp | {k: v for k, v in IDEAL_VALUES.items() if k in names}))
