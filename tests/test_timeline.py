"""The timeline of one step (`stepcast predict --trace FILE`, `stepcast.predict(trace=...)`, the explorer's
`/api/trace`): a Chrome trace whose last event ends at the prediction's step_time_s, built from the model's own
parts (models.physics.timeline), with the pipeline schedule's dependencies kept and no two events of one track
overlapping; the explorer draws it in headless Chromium without a console error.

The CLI and Python tests answer on the analytical priors (no store, tests/conftest.py); the served-fit tests (the
scale to a calibrated step, the explorer) use the session's built store."""

from __future__ import annotations

import json
import time
from collections import defaultdict

import pytest
from typer.testing import CliRunner

import stepcast
from models.physics.timeline import pass_order, simulate, step_timeline
from pipeline.cli import app
from tests.test_reports import browser  # noqa: F401 - the headless Chromium fixture of the report tests
from tests.test_serve import get, server  # noqa: F401 - the explorer on the built store

runner = CliRunner()
L70 = ["--model", "llama3-70b", "--gpu", "h100-sxm5-80gb", "--gpus", "512", "--global-batch", "1024", "--seq-len",
       "8192", "--tp", "8", "--pp", "4"]
BREAKDOWN = ("compute_s", "tp_comm_s", "pp_bubble_s", "pp_comm_s", "dp_comm_exposed_s", "cp_comm_s", "ep_comm_s",
             "optimizer_s")
#: the track of each stream (pipeline.trace's thread ids: models.physics.timeline.STREAMS)
TRACK = {"compute": 0, "tp": 1, "cp": 2, "ep": 3, "pp": 4, "gather": 5, "grad": 6}


def predict_with_trace(tmp_path, *args, store=None):
    """(the prediction's JSON row, the trace document) of `stepcast predict ARGS --trace FILE`."""
    path = tmp_path / "step.json"
    r = runner.invoke(app, [*(["--store", str(store)] if store else []), "predict", *args, "--trace", str(path),
                            "--format", "json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)[0], json.loads(path.read_text())


def complete(doc) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def end_us(doc) -> float:
    return max(e["ts"] + e["dur"] for e in complete(doc))


def check_tracks_never_overlap(doc) -> None:
    tracks = defaultdict(list)
    for e in complete(doc):
        assert e["dur"] > 0 and e["ts"] >= 0, e
        tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for key, spans in tracks.items():
        spans.sort()
        for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
            assert b0 >= a1 - 1e-6 * max(a1, 1.0), f"track {key}: {an} [{a0}, {a1}] overlaps {bn} [{b0}, {b1}]"


def check_pipeline_dependencies(doc, pp: int, vpp: int) -> int:
    """Every forward of micro-batch i on virtual stage k starts after its forward on k - 1 has ended and that stage's
    pipeline send with it; every backward on k after its backward on k + 1 (and its send). Returns the checks made."""
    ev = complete(doc)
    by_name = {(e["pid"], e["name"]): e for e in ev}
    made = 0
    for e in ev:
        if e["tid"] != TRACK["compute"] or e["cat"] not in ("forward", "backward"):
            continue
        i, c, s = e["args"]["micro_batch"], e["args"].get("chunk", 0), e["pid"]
        k = c * pp + s
        step = -1 if e["cat"] == "forward" else 1
        j = k + step
        if not 0 <= j < pp * vpp:
            continue
        ps, pc = j % pp, j // pp
        label = ("F" if e["cat"] == "forward" else "B") + f"{i}" + (f".{pc}" if vpp > 1 else "")
        prev = by_name[(ps, label)]
        ready = prev["ts"] + prev["dur"]
        send = by_name.get((ps, f"PP {label} exposed"))
        if send is not None:  # the neighbour's send of this pass, after its compute and before this pass
            assert send["ts"] >= ready - 1e-6 and send["tid"] == TRACK["pp"]
            ready = send["ts"] + send["dur"]
        assert e["ts"] >= ready - 1e-6 * ready, (e["name"], s, e["ts"], label, ps, ready)
        made += 1
    return made


def sums_per_stage(doc, stage: int) -> dict[str, float]:
    """The seconds of each breakdown field the events of one stage add up to."""
    out = defaultdict(float)
    for e in complete(doc):
        if e["pid"] != stage:
            continue
        d = e["dur"] / 1e6
        if e["cat"] in ("forward", "backward", "host"):
            out["compute_s"] += d
        elif e["cat"] == "bubble":
            out["pp_bubble_s"] += d
        elif e["cat"] == "optimizer":
            out["optimizer_s"] += d
        elif e["cat"] == "straggler":
            out["straggler_s"] += d
        elif e["cat"] == "comm exposed":
            field = {1: "tp_comm_s", 2: "cp_comm_s", 3: "ep_comm_s", 4: "pp_comm_s", 5: "dp_comm_exposed_s",
                     6: "dp_comm_exposed_s"}[e["tid"]]
            out[field] += d
    return out


# ------------------------------------------------------------------ the schedule, alone

@pytest.mark.parametrize("pp,vpp,m", [(1, 1, 6), (2, 1, 1), (4, 1, 3), (4, 1, 16), (8, 1, 32), (2, 2, 4), (4, 2, 8),
                                      (4, 3, 12), (8, 4, 16), (3, 5, 9)])
@pytest.mark.parametrize("fwd,bwd", [(1.0, 2.0), (1.0, 1.0), (0.7, 3.1)])
def test_the_schedules_makespan_is_the_models_pipeline_term(pp, vpp, m, fwd, bwd):
    """Megatron-Core's 1F1B and interleaved orders with equal passes take (m vpp + pp - 1) passes: the model's
    t_mb x (m + (pp - 1) / vpp), whatever the forward / backward ratio."""
    starts = simulate(pp, vpp, m, fwd / vpp, bwd / vpp)
    assert len(starts) == 2 * m * vpp * pp
    end = max(t + (fwd if k[0] == "F" else bwd) / vpp for k, t in starts.items())
    assert end == pytest.approx((fwd + bwd) * (m + (pp - 1) / vpp), rel=1e-12)


def test_pass_order_is_megatrons():
    """1F1B: the first stage warms up with pp - 1 forwards, the last alternates from the start; interleaved: the
    first stage runs (pp - 1) x 2 + (vpp - 1) x pp warm-up forwards, chunk by chunk of pp micro-batches."""
    assert pass_order(4, 1, 6, 0)[:5] == [("F", 0, 0), ("F", 1, 0), ("F", 2, 0), ("F", 3, 0), ("B", 0, 0)]
    assert pass_order(4, 1, 6, 3)[:4] == [("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0)]
    order = pass_order(2, 2, 4, 0)
    assert order[:5] == [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1), ("F", 2, 0)]
    assert order[5] == ("B", 0, 1)  # the first backward is of the last chunk
    assert sorted(order) == sorted([(k, i, c) for k in "FB" for i in range(4) for c in range(2)])


PARTS = {"tl_fwd_mb_s": 0.1, "tl_bwd_mb_s": 0.2, "tl_tp_total_mb_s": 0.05, "tl_tp_exposed_mb_s": 0.03,
         "tl_cp_total_mb_s": 0.0, "tl_cp_exposed_mb_s": 0.0, "tl_ep_total_mb_s": 0.02, "tl_ep_exposed_mb_s": 0.0,
         "tl_pp_total_mb_s": 0.004, "tl_pp_exposed_mb_s": 0.004, "tl_gather_total_mb_s": 0.01,
         "tl_gather_exposed_mb_s": 0.002, "tl_dp_total_s": 0.3, "tl_dp_exposed_s": 0.05, "tl_optimizer_s": 0.01,
         "tl_host_wait_s": 0.02}


@pytest.mark.parametrize("pp,vpp,m,lag", [(4, 1, 8, 0.0), (4, 2, 8, 0.0), (4, 2, 8, 0.04)])
def test_a_scaled_timeline_ends_at_the_scaled_step(pp, vpp, m, lag):
    """Every part in its place: the end is the (scaled) step, with a straggler's wait where the model has one."""
    t_mb = 0.1 + 0.2 + 0.03 + 0.004 + 0.002
    step = t_mb * (m + (pp - 1) / vpp) + 0.05 + 0.01 + 0.02 + lag
    for scale in (1.0, 1.37):
        events = step_timeline(dict(PARTS, tl_step_s=step, tl_straggler_s=lag), pp, vpp, m, scale=scale)
        assert sum(e.dur_s for e in events if e.cat == "straggler" and e.stage == 2) == pytest.approx(lag * scale)
        assert max(e.end_s for e in events) == pytest.approx(step * scale, rel=1e-12)
        bubble = sum(e.dur_s for e in events if e.cat == "bubble" and e.stage == 0)
        assert bubble == pytest.approx(scale * t_mb * (pp - 1) / vpp, rel=1e-9)
        hidden_tp = sum(e.dur_s for e in events
                        if e.cat == "comm overlapped" and e.stream == "TP comm" and e.stage == 1)
        assert hidden_tp == pytest.approx(scale * m * 0.02, rel=1e-9)


# ------------------------------------------------------------------ the trace of a prediction

@pytest.mark.parametrize("extra,schedule", [(["--vpp", "1"], "1f1b"), (["--vpp", "5"], "interleaved"),
                                            (["--pp", "1", "--tp", "8", "--sharding", "zero3"], "none")])
def test_the_trace_ends_at_step_time_and_keeps_the_schedule(tmp_path, extra, schedule):
    row, doc = predict_with_trace(tmp_path, *L70, *extra)
    assert doc["otherData"]["schedule"] == schedule and doc["otherData"]["schedule_exact"]
    assert end_us(doc) / 1e6 == pytest.approx(row["step_time_s"], rel=1e-6)
    check_tracks_never_overlap(doc)
    pp, vpp = row["pp"], row["vpp"]
    made = check_pipeline_dependencies(doc, pp, vpp)
    assert made == (2 * row["n_microbatches"] * (pp * vpp - 1) if pp > 1 else 0)
    for stage in range(pp):  # each stage's events add up to the prediction's breakdown
        got = sums_per_stage(doc, stage)
        for field in BREAKDOWN + ("straggler_s",) * ("straggler_s" in row):  # the straggler where the model has it
            assert got[field] == pytest.approx(row[field], rel=1e-6, abs=1e-9), (stage, field)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names[(0, 0)] == "compute" and names[(0, 1)] == "TP comm"
    assert {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"} == \
        {f"stage {s}" for s in range(pp)}


def test_the_trace_shows_overlapped_traffic_beside_the_compute_it_hides_behind(tmp_path):
    """ZeRO-3 gathers per pass and the gradient reduction behind the last backward passes: overlapped events on
    their own tracks, inside the time of the compute they hide behind."""
    row, doc = predict_with_trace(tmp_path, "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--gpus", "64",
                                  "--global-batch", "256", "--seq-len", "8192", "--tp", "2", "--pp", "2", "--vpp", "2",
                                  "--sharding", "zero1")
    ev = complete(doc)
    hidden = [e for e in ev if e["cat"] == "comm overlapped"]
    assert {e["tid"] for e in hidden} >= {TRACK["grad"]}
    compute = {(e["pid"], e["name"]): e for e in ev if e["tid"] == 0}
    for e in hidden:
        if "overlapped_with" in e["args"] and (e["pid"], e["args"]["overlapped_with"]) in compute:
            c = compute[(e["pid"], e["args"]["overlapped_with"])]
            assert c["ts"] - 1e-6 <= e["ts"] and e["ts"] + e["dur"] <= c["ts"] + c["dur"] + 1e-6
    assert end_us(doc) / 1e6 == pytest.approx(row["step_time_s"], rel=1e-6)


@pytest.mark.parametrize("stack,vpp,schedule", [("dualpipe", "1", "dualpipe"), ("ncclx", "2", "balanced_interleave")])
def test_a_stacks_schedule_is_drawn_approximated_and_said(tmp_path, stack, vpp, schedule):
    """DualPipe (DeepSeek's HAI-LLM) and Llama 3's balanced interleave (Meta's stack) have no exact drawing: the
    1F1B / interleaved order the model times them by, labelled approximated."""
    row, doc = predict_with_trace(tmp_path, "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--gpus", "64",
                                  "--global-batch", "256", "--seq-len", "8192", "--tp", "2", "--pp", "4",
                                  "--vpp", vpp, "--stack", stack)
    meta = doc["otherData"]
    assert meta["schedule"] == schedule and meta["schedule_exact"] is False and "approximated" in meta["schedule_note"]
    assert check_pipeline_dependencies(doc, 4, int(vpp)) > 0
    assert end_us(doc) / 1e6 == pytest.approx(row["step_time_s"], rel=1e-6)
    check_tracks_never_overlap(doc)


def test_the_python_api_writes_the_same_trace(tmp_path):
    row, doc = predict_with_trace(tmp_path, *L70, "--vpp", "2")
    path = tmp_path / "py.json"
    df = stepcast.predict(model="llama3-70b", gpu="h100-sxm5-80gb", gpus=512, global_batch=1024, seq_len=8192, tp=8,
                          pp=4, vpp=2, trace=str(path))
    assert df["step_time_s"][0] == pytest.approx(row["step_time_s"], rel=1e-12)
    assert json.loads(path.read_text())["traceEvents"] == doc["traceEvents"]
    with pytest.raises(stepcast.InputError, match="one configuration"):
        stepcast.predict(model="llama3-70b", gpu="h100-sxm5-80gb", gpus=[512, 1024], global_batch=1024,
                         seq_len=8192, tp=8, pp=4, trace=str(path))


def test_a_trace_that_cannot_be_written_or_drawn_is_one_line(tmp_path):
    r = runner.invoke(app, ["predict", *L70, "--trace", str(tmp_path / "no" / "such" / "dir.json")])
    assert r.exit_code == 1 and "--trace" in r.output and "cannot write the trace" in r.output
    assert "Traceback" not in r.output
    r = runner.invoke(app, ["predict", "--runs", "measurements/measured_runs.csv", "--trace", str(tmp_path / "t.json")])
    assert r.exit_code == 2 and "not with --runs" in r.output


# ------------------------------------------------------------------ on the served fit: the scale and the explorer

def test_an_adapted_prediction_scales_the_timeline_to_its_step(built_store, tmp_path):
    """A cluster's runs 25% slower than the fit: the served step grows, and so does every event, said in the trace."""
    few = tmp_path / "few.csv"
    few.write_text("run_id,model_name,gpu,n_gpus,global_batch_seqs,seq_len,tp,pp,sharding,metric,value,unit\n"
                   "r0,llama3-8b,h100-sxm5-80gb,8,32,8192,1,1,fsdp,tokens_per_s_per_gpu,6000,tokens/s/GPU\n"
                   "r1,llama3-8b,h100-sxm5-80gb,16,64,8192,1,1,fsdp,tokens_per_s_per_gpu,5900,tokens/s/GPU\n"
                   "r2,llama3-70b,h100-sxm5-80gb,64,128,8192,8,1,fsdp,tokens_per_s_per_gpu,600,tokens/s/GPU\n")
    row, doc = predict_with_trace(tmp_path, *L70, "--vpp", "2", "--calibrate-on", str(few), store=built_store)
    meta = doc["otherData"]
    assert meta["scale"] != pytest.approx(1.0, abs=1e-3) and "scaled" in meta["scale_note"]
    assert end_us(doc) / 1e6 == pytest.approx(row["step_time_s"], rel=1e-6)
    assert meta["physics_step_time_s"] * meta["scale"] == pytest.approx(row["step_time_s"], rel=1e-9)
    check_tracks_never_overlap(doc)
    assert check_pipeline_dependencies(doc, 4, 2) > 0


def test_the_explorer_api_answers_the_cli_trace(server, built_store, tmp_path):  # noqa: F811
    base, _ = server
    q = {"model": "llama3-70b", "gpu": "h100-sxm5-80gb", "gpus": "512", "global_batch": "1024", "seq_len": "8192",
         "tp": "8", "pp": "4", "vpp": "2"}
    status, doc = get(base, "/api/trace", q)
    assert status == 200, doc
    _, cli_doc = predict_with_trace(tmp_path, *[x for k, v in q.items() for x in (f"--{k.replace('_', '-')}", v)],
                                    store=built_store)
    assert doc["traceEvents"] == cli_doc["traceEvents"]
    status, err = get(base, "/api/trace", {**q, "tp": "7"})  # the CLI's message, as /api/predict answers it
    assert status == 400 and err["error"] == "--gpus 512 is not divisible by tp 7 x pp 4 x cp 1 = 28"


def test_the_explorer_draws_the_timeline_of_the_best_layout(server, browser):  # noqa: F811
    base, _ = server
    browser.events.clear()
    browser.call("Page.navigate", url=base + "/#gpus=h100-sxm5-80gb&model=llama3-8b&tokens=1e12&seq_len=8192"
                                               "&policy=strong&global_batch=256&max_gpus=256&n=64&months=3")
    deadline, state = time.time() + 90, None
    while time.time() < deadline:
        state = browser.evaluate("""(() => ({busy: window.explorer.busy, t: window.explorer.timeline,
            notes: document.getElementById('timeline-notes').textContent,
            h: document.getElementById('timeline-canvas').height,
            painted: (() => { const c = document.getElementById('timeline-canvas');
              const d = c.getContext('2d').getImageData(150, 18, c.width - 160, c.height - 22).data;
              let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; })()}))()""")
        if state and state["busy"] == 0 and state["t"]:
            break
        time.sleep(0.25)
    assert state and state["t"], state
    t = state["t"]
    assert t["events"] > 0 and t["rows"] >= 1 and state["painted"] > 1000, state
    assert t["end_s"] == pytest.approx(t["step_time_s"], rel=1e-6) and "step_time_s" in state["notes"]
    errors, requests = browser.problems((base + "/",))
    assert not errors, errors[:3]
    assert not requests, requests[:3]
