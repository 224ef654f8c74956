"""A timeline of one optimizer step, drawn from the parts the step-time model sums (pure: numbers in, events out).

The step-time model (``models.physics.parts.step_time``) times a step as

    t_mb x (m + (pp - 1) / vpp) + exposed DP traffic + optimizer + host wait,

with t_mb one micro-batch's time on the stage that paces the pipeline: its forward and backward compute plus the
TP, CP, EP, PP and ZeRO-3/FSDP gather traffic the overlap budget leaves exposed. ``step_timeline`` lays the same
parts out in time: every stage runs its forward and backward passes (one per micro-batch and model chunk) in the
order of the pipeline schedule, each pass waiting for the pass it needs on the neighbouring stage; a pass occupies
its compute, then its exposed traffic (the compute stream waits for it), then its pipeline send. With equal passes
on every stage the schedule's makespan is (m vpp + pp - 1) passes, i.e. exactly the model's
t_mb x (m + (pp - 1) / vpp): the idle time of each stage is the bubble (``pp_bubble_s``). After the last backward
come the host's wait (the model's soft maximum of GPU and host time, drawn as one block), the wait for the slowest
accelerator where the model has that part (``tl_straggler_s``), the exposed DP traffic and the optimizer. Traffic that hides behind compute is drawn on its stream's track beside the compute it hides behind.

What is approximated, and said in each event's ``args`` and in ``docs/timeline.md``: every stage is drawn with the
pacing stage's times (the model times the pipeline by its slowest stage); each stream's traffic of a micro-batch is
split between its forward and its backward in the ratio of their compute, and drawn as one block per pass; the
recompute the model counts with the forward pass is drawn inside it. Schedules: plain 1F1B (Megatron-Core's
non-interleaved order) and the interleaved schedule (Megatron-Core's order of virtual stages) are exact for the
model's times; DualPipe and Llama 3's balanced interleave are drawn in the 1F1B / interleaved order the model times
them by, labelled approximated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from models.memory.model import SCHEDULE_BALANCED, SCHEDULE_DUALPIPE

#: the tracks of a stage, in the order they are drawn (Chrome trace thread ids are their indices)
STREAMS = ("compute", "TP comm", "CP comm", "EP comm", "PP comm", "DP gather", "DP grad sync")
#: per-micro-batch traffic streams: (name in models.physics.step_time.TIMELINE_COLUMNS, track)
MB_STREAMS = (("tp", "TP comm"), ("cp", "CP comm"), ("ep", "EP comm"), ("gather", "DP gather"), ("pp", "PP comm"))
#: the schedules the timeline draws exactly (the others: in the order the model times them by, labelled approximated)
EXACT_SCHEDULES = ("none", "1f1b", "interleaved")
#: blocks shorter than this are not drawn (a nanosecond: below any trace viewer's resolution); the time still passes
MIN_EVENT_S = 1e-9


@dataclass(frozen=True)
class Event:
    """One block of the timeline: on stage ``stage``'s track ``stream``, from ``start_s`` for ``dur_s`` seconds."""

    name: str
    cat: str  # forward, backward, bubble, comm exposed, comm overlapped, host, optimizer
    stage: int
    stream: str
    start_s: float
    dur_s: float
    args: dict = field(default_factory=dict)

    @property
    def end_s(self) -> float:
        return self.start_s + self.dur_s


def schedule_of(code: float | None, pp: int, vpp: int) -> tuple[str, bool, str]:
    """(schedule name, exact, sentence) of a configuration: the stack's schedule code
    (models.memory.model.PIPELINE_SCHEDULES; None or NaN: Megatron-Core's, plain 1F1B at vpp 1, else interleaved)."""
    if pp <= 1:
        return "none", "none" in EXACT_SCHEDULES, ("no pipeline: the micro-batches run one after another (gradient "
                                                   "accumulation)")
    base = "interleaved" if vpp > 1 else "1f1b"
    c = None if code is None or code != code else int(code)
    if c == SCHEDULE_DUALPIPE:
        return "dualpipe", False, (f"DualPipe approximated: drawn in the {base} order with its bubble, as the "
                                   "step-time model times it (DualPipe feeds micro-batches from both ends of the "
                                   "pipeline)")
    if c == SCHEDULE_BALANCED and vpp > 1:
        return "balanced_interleave", False, ("Llama 3's balanced interleave approximated: drawn in Megatron-Core's "
                                              "interleaved order with equal stages, as the step-time model times it "
                                              "(its first and last stages hold one layer fewer)")
    if base == "interleaved":
        return base, base in EXACT_SCHEDULES, f"Megatron-Core's interleaved 1F1B, {vpp} model chunks per stage"
    return base, base in EXACT_SCHEDULES, "Megatron-Core's 1F1B (one forward, one backward)"


def pass_order(pp: int, vpp: int, m: int, stage: int) -> list[tuple[str, int, int]]:
    """The passes of one stage in schedule order: (F or B, micro-batch, model chunk). Megatron-Core's schedules
    (megatron/core/pipeline_parallel/schedules.py): without interleaving pp - stage - 1 warm-up forwards, then one
    forward and one backward in turn, then the cool-down backwards; interleaved, (pp - stage - 1) x 2 + (vpp - 1) x pp
    warm-up forwards over m x vpp chunk passes, chunk (k // pp) % vpp of forward k (counted backwards for the
    backward passes), micro-batch (k // (pp vpp)) pp + k % pp."""
    if vpp <= 1:
        warm = min(pp - stage - 1, m)
        fwd = [("F", i, 0) for i in range(m)]
        bwd = [("B", i, 0) for i in range(m)]
    else:
        total = m * vpp
        warm = min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)

        def mb(k: int) -> int:
            return (k // (pp * vpp)) * pp + k % pp

        fwd = [("F", mb(k), (k // pp) % vpp) for k in range(total)]
        bwd = [("B", mb(k), vpp - 1 - (k // pp) % vpp) for k in range(total)]
    order = fwd[:warm]
    for j in range(len(fwd) - warm):
        order += [fwd[warm + j], bwd[j]]
    return order + bwd[len(fwd) - warm:]


def simulate(pp: int, vpp: int, m: int, d_fwd: float, d_bwd: float) -> dict[tuple[str, int, int, int], float]:
    """Start time of every pass (F/B, micro-batch, chunk, stage) when each stage runs its passes in schedule order
    (``pass_order``), a forward of virtual stage k = chunk x pp + stage after the same micro-batch's forward on k - 1,
    a backward after its backward on k + 1 (the last virtual stage: after its own forward), each pass lasting
    ``d_fwd`` or ``d_bwd``. ValueError when the order deadlocks."""
    orders = [pass_order(pp, vpp, m, s) for s in range(pp)]
    last = pp * vpp - 1
    end: dict[tuple[str, int, int], float] = {}  # (F/B, micro-batch, virtual stage) -> end
    start: dict[tuple[str, int, int, int], float] = {}
    ptr, free = [0] * pp, [0.0] * pp
    remaining = sum(len(o) for o in orders)
    while remaining:
        moved = False
        for s in range(pp):
            while ptr[s] < len(orders[s]):
                kind, i, c = orders[s][ptr[s]]
                k = c * pp + s
                dep = (("F", i, k - 1) if k > 0 else None) if kind == "F" else \
                    (("F", i, k) if k == last else ("B", i, k + 1))
                if dep is not None and dep not in end:
                    break
                t0 = max(free[s], end[dep] if dep is not None else 0.0)
                free[s] = end[(kind, i, k)] = t0 + (d_fwd if kind == "F" else d_bwd)
                start[(kind, i, c, s)] = t0
                ptr[s] += 1
                remaining -= 1
                moved = True
        if not moved:
            raise ValueError(f"pipeline schedule deadlocks (pp={pp}, vpp={vpp}, m={m})")
    return start


def _stream_split(parts: Mapping[str, float], frac_fwd: float, vpp: int) -> dict[str, dict[str, float]]:
    """Per chunk pass, for F and B: each stream's exposed and hidden seconds (a micro-batch's traffic split between
    its forward and backward in the ratio of their compute, and over the model chunks)."""
    out: dict[str, dict[str, float]] = {"F": {}, "B": {}}
    for key, _ in MB_STREAMS:
        total = max(parts[f"tl_{key}_total_mb_s"], 0.0)
        exposed = min(max(parts[f"tl_{key}_exposed_mb_s"], 0.0), total)
        for kind, share in (("F", frac_fwd), ("B", 1.0 - frac_fwd)):
            out[kind][key + "_exposed"] = exposed * share / vpp
            out[kind][key + "_hidden"] = (total - exposed) * share / vpp
    return out


def step_timeline(parts: Mapping[str, float], pp: int, vpp: int, m: int, scale: float = 1.0) -> list[Event]:
    """The events of one optimizer step of a configuration whose model parts are ``parts`` (one row of
    models.physics.step_time.TIMELINE_COLUMNS, seconds): ``pp`` stages, ``vpp`` model chunks per stage, ``m``
    micro-batches per step, every time multiplied by ``scale`` (the calibrated step over the physics step). The
    last event ends at ``scale x tl_step_s``; per stage, the compute track's forward, backward and host events sum
    to the model's ``compute_s``, its bubble events to ``pp_bubble_s``, each stream's exposed events to its
    ``*_comm_s`` (the DP tracks together to ``dp_comm_exposed_s``), a straggler event to ``straggler_s`` where the
    model has that part (``tl_straggler_s``, absent: none)."""
    pp, vpp, m = int(pp), int(vpp), int(m)
    if pp < 1 or vpp < 1 or m < 1:
        raise ValueError(f"pp, vpp and the micro-batch count must be >= 1 (got {pp}, {vpp}, {m})")
    fwd, bwd = max(parts["tl_fwd_mb_s"], 0.0), max(parts["tl_bwd_mb_s"], 0.0)
    frac = fwd / (fwd + bwd) if fwd + bwd > 0 else 0.5
    split = _stream_split(parts, frac, vpp)
    compute = {"F": fwd / vpp, "B": bwd / vpp}
    dur = {k: compute[k] + sum(v for n, v in split[k].items() if n.endswith("_exposed")) for k in ("F", "B")}
    starts = simulate(pp, vpp, m, dur["F"], dur["B"])
    x = float(scale)
    events: list[Event] = []

    def add(name, cat, stage, stream, t0, d, **args):
        if d * x >= MIN_EVENT_S:
            events.append(Event(name, cat, stage, stream, t0 * x, d * x, args))

    busy: list[list[tuple[float, float]]] = [[] for _ in range(pp)]
    for (kind, i, c, s), t0 in starts.items():
        label = f"{kind}{i}" + (f".{c}" if vpp > 1 else "")
        info = {"micro_batch": i, "chunk": c} if vpp > 1 else {"micro_batch": i}
        add(label, "forward" if kind == "F" else "backward", s, "compute", t0, compute[kind], **info)
        t = t0 + compute[kind]
        for key, stream in MB_STREAMS:
            hidden = min(split[kind][key + "_hidden"], compute[kind])
            add(f"{key.upper() if key != 'gather' else 'param gather'} {label}", "comm overlapped", s, stream, t0,
                hidden, overlapped_with=label, **info)
            exposed = split[kind][key + "_exposed"]
            add(f"{key.upper() if key != 'gather' else 'param gather'} {label} exposed", "comm exposed", s, stream, t,
                exposed, **info)
            t += exposed
        busy[s].append((t0, t0 + dur[kind]))
    pipe_end = max(e for b in busy for _, e in b) if starts else 0.0
    for s in range(pp):  # the bubble: every stretch a stage waits before the end of the pipeline
        t = 0.0
        for b0, b1 in sorted(busy[s]):
            add("bubble", "bubble", s, "compute", t, b0 - t)
            t = max(t, b1)
        add("bubble", "bubble", s, "compute", t, pipe_end - t)
    host = max(parts["tl_host_wait_s"], 0.0)
    dp_total, dp_exp = max(parts["tl_dp_total_s"], 0.0), max(parts["tl_dp_exposed_s"], 0.0)
    opt = max(parts["tl_optimizer_s"], 0.0)
    lag = max(parts.get("tl_straggler_s", 0.0), 0.0)
    for s in range(pp):
        hidden = min(max(dp_total - dp_exp, 0.0), pipe_end)
        add("grad sync", "comm overlapped", s, "DP grad sync", pipe_end - hidden, hidden,
            overlapped_with="the last backward passes and the cool-down")
        add("host wait", "host", s, "compute", pipe_end, host,
            note="the GPU's wait for the host (the model's soft maximum of GPU and host issue time), one block")
        add("straggler wait", "straggler", s, "compute", pipe_end + host, lag,
            note="the expected wait for the slowest accelerator of the job, one block")
        add("grad sync exposed", "comm exposed", s, "DP grad sync", pipe_end + host + lag, dp_exp)
        add("optimizer step", "optimizer", s, "compute", pipe_end + host + lag + dp_exp, opt)
    events.sort(key=lambda e: (e.stage, STREAMS.index(e.stream), e.start_s))
    return events


def chrome_trace(events: list[Event], pp: int, meta: Mapping) -> dict:
    """The Chrome Trace Event Format document of ``events`` (JSON object format): an "X" complete event per block
    (``ts``/``dur`` in microseconds, ``pid`` the stage, ``tid`` its track), "M" metadata events naming each stage
    and track and keeping their order, and ``meta`` (the configuration, the schedule, the scale) in ``otherData``
    and in the args of each stage's name."""
    out: list[dict] = []
    used = {(e.stage, e.stream) for e in events}
    for s in range(pp):
        out.append({"ph": "M", "name": "process_name", "pid": s, "tid": 0,
                    "args": {"name": f"stage {s}", **meta}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": s, "tid": 0, "args": {"sort_index": s}})
        for t, stream in enumerate(STREAMS):
            if (s, stream) in used:
                out.append({"ph": "M", "name": "thread_name", "pid": s, "tid": t, "args": {"name": stream}})
                out.append({"ph": "M", "name": "thread_sort_index", "pid": s, "tid": t, "args": {"sort_index": t}})
    for e in events:
        out.append({"ph": "X", "name": e.name, "cat": e.cat, "pid": e.stage, "tid": STREAMS.index(e.stream),
                    "ts": e.start_s * 1e6, "dur": e.dur_s * 1e6, "args": e.args})
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": dict(meta)}
