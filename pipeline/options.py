"""The options of `stepcast predict`, `search`, `curve`, `frontier` and `plan`, each defined once.

An `Option` is one option's keyword (`global_batch`; the CLI's flag is `--global-batch`), the type of its value,
its default and help, and what the CLI declares beside them (short flag, lower bound, metavar). `PREDICT`,
`SEARCH`, `CURVE`, `FRONTIER` and `PLAN` list each command's options in the order `--help` shows them; a command
that means an option differently (search *fixes* a layout dimension that predict *sets*) has its own variant
(`Option.but`). Every layer builds one frozen options object of the command (`PredictOptions`, ...) from them:

| layer | builds the options object from | where |
|---|---|---|
| the CLI | the flags (a typer command generated from the list) | pipeline/commands/common.py `command` |
| the Python API | the keywords of `stepcast.predict`, ... (same names and defaults) | stepcast/api.py |
| the explorer | the query parameters of `/api/predict`, ... | pipeline/serve.py `query_parameters` |

and the functions of pipeline/api.py compute from the object. A field's type is the value's (`int`, `float`,
`str`, `bool`, `Path`; None where the default is None). Every numeric field is checked when the object is built,
whichever layer builds it (`check_bounds`): a finite number, whole for an `int`, at least `Option.min` and at most
`Option.max` (the largest the tool plans for, models.core.limits), else an `InputError` naming the value and the
bound. The options that only shape the printout (`--format`,
`--out`, the hidden `--intervals`) are `cli_only`: the CLI has them, the options object does not. This module
imports nothing heavy: `stepcast --help` and `import stepcast` read it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping, Optional

from models.core import limits
from models.core.limits import bound_problem


class InputError(ValueError):
    """Bad input to a command: the message says which flag/field and what was expected (the numbers that broke the
    rule). `exit_code` is the status the CLI exits with (2 for a usage error, 1 where the command has always said
    1). Defined here, where the options are checked; pipeline.api (and `stepcast`) export it."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


# ------------------------------------------------------------------ help the commands share

ASSUMPTIONS_HELP = ("realistic (the calibrated model: fitted parameters, residual correction, 90% interval) or "
                    "ideal (Epoch AI's ideal conditions: no host overhead or GEMM-size ramp, perfect overlap, no "
                    "memory allowance, no stragglers; latency stays).")
ANALYTICAL_HELP = "The analytical model with the prior parameters: no fit, no correction, no interval."
TP_MODE_HELP = ("Tensor-parallel form: 1d (Megatron: weights split along one dimension) or 2d (d_model and d_ff "
                "split over an r x c grid of the tp ranks, r the largest divisor of tp <= sqrt(tp); models.physics.tp2d).")
TP_MODE_FIX_HELP = "Fix the tensor-parallel form: 1d or 2d [default: both for tp >= 4, the search chooses]."
# the network-tier flags (predict, search, curve, frontier, plan) override the accelerator's row
SCALEUP_SIZE_HELP = "Accelerators per scale-up domain."
SCALEUP_GBPS_HELP = "Scale-up bandwidth per accelerator, GB/s per direction."
SCALEOUT_GBPS_HELP = "Scale-out (network) bandwidth per accelerator, GB/s per direction."
OVERSUBSCRIPTION_HELP = ("Oversubscription of the network tier above the pods, a ratio >= 1 [default: 1, "
                         "non-blocking]: 3 = a 3:1 oversubscribed fat-tree: traffic crossing the pod tier gets 1/3 "
                         "of the scale-out bandwidth. Without --pod-size, all traffic leaving a scale-up domain "
                         "crosses it.")
POD_SIZE_HELP = ("Accelerators per pod, below the oversubscribed tier (at least the scale-up domain) [default: no "
                 "pod boundary]. A parallel group whose ranks span pods pays the oversubscription; a job within "
                 "one pod never does.")
BATCH_RULE_HELP = ("Batch ceiling: deepseek (0.292 C^0.3271 tokens), kaplan (critical batch, Kaplan et al. 2020) "
                   "or fixed (4M tokens).")
ARCH_FILE_HELP = ("Architecture from a file instead of --model: a row of the architectures schema (CSV/JSON) or a "
                  "Hugging Face config.json.")


@dataclass(frozen=True)
class Option:
    """One option of a command: keyword, value type, default, help and the CLI's declaration."""

    name: str  # the keyword and query parameter; the CLI's flag is it with dashes unless `flag` says otherwise
    type: Any  # int, float, str, bool or Path
    default: Any = None
    help: Optional[str] = None
    short: Optional[str] = None  # the CLI's one-letter alias, e.g. "-m"
    min: Optional[float] = None  # lower bound the CLI declares (and every layer checks: check_bounds)
    max: Optional[float] = None  # the largest value the tool plans for (models.core.limits; checked as `min`)
    metavar: Optional[str] = None
    required: bool = False  # the command refuses to run without it (typer's `...`; the field's default stays None)
    negatable: bool = False  # an on/off pair, --x/--no-x
    hidden: bool = False
    flag: Optional[str] = None  # the CLI's long flag where it is not `--` + the name with dashes (--format)
    cli_only: bool = False  # shapes the printout only: a CLI flag, not a field, keyword or query parameter

    @property
    def long_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def annotation(self) -> Any:
        """The field's type: Optional where the default is None."""
        return Optional[self.type] if self.default is None else self.type

    def but(self, **changes: Any) -> "Option":
        """This option as another command means it (another default or help)."""
        return dataclasses.replace(self, **changes)


# ------------------------------------------------------------------ the options, once each
# the architecture and the accelerator
MODEL = Option("model", str, short="-m", help="Architecture id, name or alias, e.g. llama3-70b, DeepSeek-V3 "
                                              "(`stepcast list models`).")
ARCH_FILE = Option("arch_file", Path, metavar="PATH", help=ARCH_FILE_HELP)
GPU = Option("gpu", str, help="Hardware id or name, e.g. h100-sxm5-80gb, H100 (`stepcast list gpus`).")
HARDWARE_FILE = Option("hardware_file", Path, metavar="PATH", help="Accelerator from a file instead of --gpu: a "
                       "row of the hardware_specs schema (CSV/JSON).")
# the job's size
GPUS = Option("gpus", int, short="-n", min=1, max=limits.MAX_ACCELERATORS, help="Accelerators in the job (N).")
GLOBAL_BATCH = Option("global_batch", int, short="-b", min=1, max=limits.MAX_SEQUENCES, help="Sequences per step.")
SEQ_LEN = Option("seq_len", int, short="-s", min=1, max=limits.MAX_SEQ_LEN, help="Tokens per sequence.")
TOKENS = Option("tokens", float, max=limits.MAX_TOKENS, help="Training tokens (default 20 x parameters).")
MAX_GPUS = Option("max_gpus", int, 16384, min=1, max=limits.MAX_ACCELERATORS, help="Largest cluster swept.")
# the layout (predict sets it; search fixes a dimension with it, SEARCH below)
MICRO_BATCH = Option("micro_batch", int, min=1, max=limits.MAX_SEQUENCES, help="Sequences per micro-batch [default: 1].")
TP = Option("tp", int, 1, min=1, max=limits.MAX_ACCELERATORS, help="Tensor-parallel degree.")
TP_MODE = Option("tp_mode", str, "1d", help=TP_MODE_HELP)
PP = Option("pp", int, 1, min=1, max=limits.MAX_ACCELERATORS, help="Pipeline-parallel degree.")
DP = Option("dp", int, min=1, max=limits.MAX_ACCELERATORS, help="Data-parallel degree [default: N / (tp x pp x cp)].")
CP = Option("cp", int, 1, min=1, max=limits.MAX_ACCELERATORS, help="Context-parallel degree.")
EP = Option("ep", int, 1, min=1, max=limits.MAX_ACCELERATORS, help="Expert-parallel degree (carved out of dp, or folded over tp x cp x dp with "
                                      "a smaller --etp).")
ETP = Option("etp", int, min=1, max=limits.MAX_ACCELERATORS, help="Expert tensor-parallel degree of the MoE layers (Megatron-Core "
             "--expert-tensor-parallel-size; etp x ep must divide tp x cp x dp) [default: tp, or the largest that "
             "folds].")
CAPACITY_FACTOR = Option("capacity_factor", float, min=0.001, max=limits.MAX_RATIO, help="MoE expert capacity factor: an expert keeps at "
                         "most cf x the mean tokens, the rest are dropped [default: dropless].")
VPP = Option("vpp", int, min=1, max=limits.MAX_LAYERS, help="Interleaved pipeline chunks per stage (default 1 = plain 1F1B, listed in "
                                     "assumptions at pp > 1).")
SHARDING = Option("sharding", str, help="none, zero1, zero2, zero3, fsdp or hsdp [default: zero1].")
RECOMPUTE = Option("recompute", str, help="none, selective or full [default: selective], or a MaxText remat_policy "
                   "(minimal, save_qkv_proj, qkv_proj_offloaded, ...: selective with its save list).")
SEQUENCE_PARALLEL = Option("sequence_parallel", bool, negatable=True,
                           help="Megatron sequence parallelism [default: on when tp > 1].")
# precision
DTYPE = Option("dtype", str, "bf16", help="Precision of the matmuls.")
LAYERS_16BIT = Option("layers_16bit", int, min=0, max=limits.MAX_LAYERS, metavar="N", help="Layers (blocks, for hybrids) at the end of the "
                      "stack that a low-precision recipe keeps in BF16 (Megatron-Core --num-layers-at-end-in-bf16) "
                      "[default: the model's published recipe, e.g. 14 for Nemotron 3 Super in NVFP4, else 0].")
# the network tiers and memory, overriding the accelerator's row
SCALEUP_SIZE = Option("scaleup_size", int, max=limits.MAX_ACCELERATORS, help=SCALEUP_SIZE_HELP)
SCALEUP_GBPS = Option("scaleup_gbps", float, max=limits.MAX_BANDWIDTH_GBPS, help=SCALEUP_GBPS_HELP)
SCALEOUT_GBPS = Option("scaleout_gbps", float, max=limits.MAX_BANDWIDTH_GBPS, help=SCALEOUT_GBPS_HELP)
OVERSUBSCRIPTION = Option("oversubscription", float, max=limits.MAX_RATIO, help=OVERSUBSCRIPTION_HELP)
POD_SIZE = Option("pod_size", int, max=limits.MAX_ACCELERATORS, help=POD_SIZE_HELP)
NETWORK = (SCALEUP_SIZE, SCALEUP_GBPS, SCALEOUT_GBPS, OVERSUBSCRIPTION, POD_SIZE)
# which model answers
ASSUMPTIONS = Option("assumptions", str, "realistic", help=ASSUMPTIONS_HELP)
ANALYTICAL_ONLY = Option("analytical_only", bool, False, help=ANALYTICAL_HELP)
# curve and frontier
DTYPE_AUTO = DTYPE.but(default=None, help="Precision (default: bf16; fp16 without BF16; fp32 on fp32-only parts).")
BATCH_RULE = Option("batch_rule", str, "deepseek", help=BATCH_RULE_HELP)
TOP = Option("top", int, 10, short="-k", min=1, max=limits.MAX_TOP, help="How many layouts to show.")
# the training stack (measurements/stacks.csv, read by the words of measurements/stack_words.csv)
STACK = Option("stack", str, metavar="NAME", help=(
    "Training stack as people write it: Megatron-LM, Megatron-Core, NeMo 24.09, Megatron-Bridge, DeepSpeed, "
    "PyTorch FSDP, torchtitan, llm-foundry, MaxText, Pax, JAX, ... (`stepcast list stacks`): its memory behaviour, "
    "kernels and software era answer, and search and plan try only the shardings it can run [default: Megatron-Core's "
    "defaults]. `generic` asks for the generic row (the wider interval of a stack the fit never saw)."))
# the served fit adapted to a cluster's own runs (models.fitting.adapt, pipeline.adaptation)
CALIBRATE_ON = Option("calibrate_on", Path, metavar="FILE", help=(
    "Runs measured on the cluster and stack you ask about (any model, layout or size; the measurement schema or "
    "the spellings --runs reads): the served fit is adapted to them in process (nothing is stored) and answers. "
    "The output says how many runs adapted it and by how much (`assumptions`, `throughput_factor`)."))
SOURCE = Option("source", str, metavar="NAME", help=(
    "Answer with the adaptation of a source the store holds (runs ingested under that `source`; `stepcast list "
    "sources`)."))
ADAPT = (CALIBRATE_ON, SOURCE)
# the printout (CLI only)
FORMAT = Option("fmt", str, "table", flag="--format", short="-f", help="table, csv or json.", cli_only=True)
OUT = Option("out", Path, short="-o", help="Write the result to this file.", cli_only=True)


# ------------------------------------------------------------------ each command's options, in --help order

PREDICT = (
    MODEL, GPU, GPUS, GLOBAL_BATCH, SEQ_LEN, MICRO_BATCH, TP, TP_MODE, PP, DP, CP, EP, ETP, CAPACITY_FACTOR, VPP,
    SHARDING, RECOMPUTE, SEQUENCE_PARALLEL,
    DTYPE.but(help="bf16, fp16, fp8, fp8-cs, mxfp8, nvfp4, fp32 or tf32."), LAYERS_16BIT, STACK,
    # the older names of two network tiers, beside --scaleup-size and --scaleout-gbps
    Option("gpus_per_node", int, min=1, max=limits.MAX_ACCELERATORS, help="Scale-up domain used [default: the accelerator's]."),
    Option("inter_node_gbps", float, min=0.001, max=limits.MAX_BANDWIDTH_GBPS, metavar="GB/S", help="Your cluster's scale-out bandwidth per "
           "accelerator, GB/s one way [default: the accelerator's typical deployment; e.g. 12.5 for 4 x 200 Gb/s NICs "
           "per 8-GPU node]."),
    SCALEUP_SIZE.but(help=SCALEUP_SIZE_HELP + " Same as --gpus-per-node (give one)."), SCALEUP_GBPS,
    SCALEOUT_GBPS.but(help=SCALEOUT_GBPS_HELP + " Same as --inter-node-gbps (give one)."), OVERSUBSCRIPTION,
    POD_SIZE,
    ARCH_FILE.but(help="Architecture from a file instead of --model: a row of the architectures.csv schema "
                       "(CSV/JSON) or a Hugging Face config.json."),
    HARDWARE_FILE.but(help="Accelerator from a file instead of --gpu: a row of the hardware_specs.csv schema "
                           "(CSV/JSON)."),
    Option("runs", Path, metavar="FILE", help="Predict every run of a measurement-schema file instead (CSV, TSV, "
           "Parquet, JSON, JSON Lines or a Markdown table)."),
    ASSUMPTIONS, ANALYTICAL_ONLY, *ADAPT,
    Option("trace", Path, metavar="FILE", help="Also write the timeline of one optimizer step to FILE: a Chrome trace "
           "(JSON) of every pipeline stage's forward and backward passes, the bubble, the exposed and overlapped "
           "TP/CP/EP/PP/DP traffic and the optimizer, ending at step_time_s; open it in ui.perfetto.dev or "
           "chrome://tracing (docs/timeline.md)."),
    FORMAT.but(help="Output: table, csv or json."), OUT.but(metavar="FILE"),
)

SEARCH = (
    MODEL.but(help="Architecture id, e.g. gpt3-175b."),
    # the architecture by its shape instead of a name
    Option("layers", int, min=1, max=limits.MAX_LAYERS, help="Architecture flags instead of --model."),
    Option("d_model", int, min=1, max=limits.MAX_WIDTH),
    Option("heads", int, min=1, max=limits.MAX_HEADS),
    Option("kv_heads", int, min=1, max=limits.MAX_HEADS, help="Default: --heads."),
    Option("ffn_dim", int, min=1, max=limits.MAX_WIDTH, help="Default: 4 x d_model."),
    Option("vocab", int, 51200, min=1, max=limits.MAX_VOCAB),
    Option("activation", str, "gelu", help="gelu or swiglu."),
    GPU.but(help="Accelerator id or name, e.g. a100-sxm4-80gb."), ARCH_FILE, HARDWARE_FILE,
    GPUS.but(required=True, help="Accelerators (N)."), GLOBAL_BATCH.but(required=True), SEQ_LEN.but(required=True),
    DTYPE, STACK, TOP, Option("rank_by", str, "throughput", help="throughput, or cost (GPU-time per token)."),
    # each fixes one dimension of the searched layouts (default: searched)
    TP.but(default=None, help="Fix the tensor-parallel degree."), TP_MODE.but(default=None, help=TP_MODE_FIX_HELP),
    PP.but(default=None, help="Fix the pipeline-parallel degree."),
    DP.but(help="Fix the data-parallel degree."), CP.but(default=None, help="Fix the context-parallel degree."),
    EP.but(default=None, help="Fix the expert-parallel degree."),
    ETP.but(help="Fix the expert tensor-parallel degree of the MoE layers [default: searched over 1 and tp]."),
    CAPACITY_FACTOR.but(help="MoE expert capacity factor [default: dropless]."),
    VPP.but(help="Fix the interleaving (chunks per stage)."), MICRO_BATCH.but(help="Fix the micro-batch."),
    SHARDING.but(help="Fix: none, zero1, zero2, zero3, fsdp, hsdp."),
    RECOMPUTE.but(help="Fix: none, selective, full."),
    ASSUMPTIONS, ANALYTICAL_ONLY, *ADAPT, *NETWORK,
    Option("intervals", bool, True, negatable=True, hidden=True, cli_only=True,
           help="Kept for scripts: the interval is always part of the prediction."),
    FORMAT, OUT,
)

CURVE = (
    MODEL.but(help="Architecture id or name, e.g. llama3-8b."), ARCH_FILE, ANALYTICAL_ONLY,
    GPU.but(required=True, help="Hardware id, e.g. h100-sxm5-80gb."),
    Option("policy", str, "strong", help="strong (fixed global batch), weak (fixed per-GPU batch) or critical (weak "
                                         "up to the critical batch size)."),
    TOKENS, SEQ_LEN.but(default=2048),
    GLOBAL_BATCH.but(help="Strong scaling batch in sequences (default 4M tokens)."),
    Option("per_gpu_batch", float, 1.0, min=0.0, max=limits.MAX_SEQUENCES, help="Weak/critical: sequences per GPU."),
    MAX_GPUS, Option("threshold", float, 0.5, help="Marginal-efficiency threshold of the knee."),
    DTYPE_AUTO, STACK, FORMAT, OUT.but(metavar="FILE", help="Write the points to this file (CSV, or the JSON "
    "document with --format json)."), ASSUMPTIONS, BATCH_RULE, *ADAPT, *NETWORK,
)

FRONTIER = (
    GPU.but(required=True, help="Hardware id, e.g. h100-sxm5-80gb, v100-sxm2-32gb, gtx-580."),
    Option("months", float, 3.0, max=limits.MAX_MONTHS, help="Time limit of the training run, in months (30.4 days)."),
    Option("min_utilization", float, 0.8, help="Fraction of the accelerator's best utilization to keep (0-1]."),
    DTYPE_AUTO.but(help="Precision (default as `stepcast curve`)."), FORMAT.but(help="table or json."),
    ANALYTICAL_ONLY,
    Option("table", bool, False, help="Also print every compute level: FLOP, N, layout, utilization and the "
                                      "binding constraint."),
    ASSUMPTIONS, BATCH_RULE, *NETWORK,
    Option("memory_gb", float, max=limits.MAX_MEMORY_GB, help="Memory per accelerator, GB (overrides the hardware row)."),
    Option("tp_form", str, "1d", help="Tensor-parallel form the layouts may use: 1d (Megatron; the default, as Epoch "
                                      "AI's counterfactuals), 2d (the 2-D grid for tp >= 4) or any (the better of "
                                      "the two)."),
)

PLAN = (
    MODEL.but(help="Architecture id or name, e.g. llama3-70b (not used with --optimal)."), ARCH_FILE,
    TOKENS.but(short="-t", help="Training tokens, e.g. 15e12."),
    Option("deadline_days", float, max=limits.MAX_DAYS, help="Finish within this many days."),
    Option("deadline_at", str, "point", help="Which days meet --deadline-days: point (the prediction) or upper (the "
                                             "interval's upper bound days_hi: a plan that finishes in time even if "
                                             "the step is as slow as the interval allows). Not used with --optimal "
                                             "(its days are the hours the budget buys)."),
    Option("budget_usd", float, max=limits.MAX_USD, help="Spend at most this many dollars."),
    Option("hardware", str, help="Comma-separated hardware ids (default: every accelerator with a price)."),
    MAX_GPUS.but(default=65536, help="Largest cluster to consider."),
    Option("price_source", str, "median", help="median (cross-cloud median), cloud:NAME (a cloud of "
                                               "measurements/cloud_prices.csv: aws, gcp, azure, oracle, lambda, nebius, "
                                               "runpod, vast, ...) or custom:FILE (CSV hardware,usd_per_gpu_hour)."),
    Option("price_file", Path, help="Same as --price-source custom:FILE."),
    SEQ_LEN.but(default=8192, short=None, help="Tokens per sequence (Llama 3 pre-training: 8192)."),
    Option("global_batch_tokens", int, 4_194_304, min=1, max=limits.MAX_BATCH_TOKENS, help="Tokens per optimizer step (Llama 3 405B started at "
                                                                "4M)."),
    DTYPE, STACK, Option("optimal", bool, False, help="Choose the model size too: the compute-optimal (Chinchilla) size and "
                                               "token count for the budget."),
    TOP.but(help="How many options to show."), ASSUMPTIONS, ANALYTICAL_ONLY, *ADAPT,
    SCALEUP_SIZE.but(help=SCALEUP_SIZE_HELP + " (every accelerator considered)"), *NETWORK[1:],
    FORMAT, OUT,
)


# ------------------------------------------------------------------ the options objects

class Options:
    """Base of the options objects: a frozen dataclass per command whose fields are its options (`OPTIONS`
    without the CLI-only ones), with their defaults."""

    COMMAND: ClassVar[str]
    OPTIONS: ClassVar[tuple[Option, ...]]

    def __post_init__(self) -> None:
        check_bounds(type(self), vars(self))

    @classmethod
    def fields(cls) -> tuple[Option, ...]:
        """The options that are fields, in order."""
        return tuple(o for o in cls.OPTIONS if not o.cli_only)

    @classmethod
    def given(cls, options: Optional["Options"] = None, **fields: Any) -> "Options":
        """`options`, with `fields` replaced; or the options of `fields` alone (a caller of pipeline.api that names
        them: `prediction(cfg, tp=8, ...)`)."""
        if options is None:
            return cls(**fields)
        return dataclasses.replace(options, **fields) if fields else options


def check_bounds(options: type[Options], values: Mapping[str, Any]) -> None:
    """InputError naming the first numeric option of `values` outside its bounds: not a finite number, not whole
    for an `int`, below `Option.min` or above `Option.max` ("--tokens 1e30 is above the largest 1e28 this tool
    plans for"). The options objects check themselves when built (`Options.__post_init__`), so the CLI, the Python
    API and the explorer refuse with the same message; --threshold and --min-utilization, fractions in (0, 1], are
    refused by the command that reads them (pipeline.api) beyond finiteness."""
    for o in options.fields():
        v = values.get(o.name)
        if v is None or o.type not in (int, float):
            continue
        problem = bound_problem(o.long_flag, v, o.min, o.max, whole=o.type is int)
        if problem:
            raise InputError(problem)


def _options_class(name: str, command: str, options: tuple[Option, ...], doc: str) -> type:
    names = [o.name for o in options]
    assert len(names) == len(set(names)), f"{command}: an option listed twice"
    fields = [(o.name, o.annotation, dataclasses.field(default=o.default, metadata={"option": o}))
              for o in options if not o.cli_only]
    return dataclasses.make_dataclass(name, fields, bases=(Options,), frozen=True, kw_only=True, namespace={
        "COMMAND": command, "OPTIONS": options, "__doc__": doc, "__module__": __name__})


PredictOptions = _options_class("PredictOptions", "predict", PREDICT,
                                "The options of `stepcast predict` (`PREDICT`): one configuration, or --runs FILE.")
SearchOptions = _options_class("SearchOptions", "search", SEARCH,
                               "The options of `stepcast search` (`SEARCH`): a layout dimension given is fixed.")
CurveOptions = _options_class("CurveOptions", "curve", CURVE, "The options of `stepcast curve` (`CURVE`).")
FrontierOptions = _options_class("FrontierOptions", "frontier", FRONTIER,
                                 "The options of `stepcast frontier` (`FRONTIER`).")
PlanOptions = _options_class("PlanOptions", "plan", PLAN, "The options of `stepcast plan` (`PLAN`).")
