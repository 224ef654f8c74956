"""The hardware facts the model keys on are columns of measurements/hardware_specs.csv, each with its source in the
row's `source_ref`: the scale-up domain (`scaleup_domain_accelerators`), one host's accelerators
(`accelerators_per_host`), the scale-up link kind (`scaleup_link`), the SM count and the generation. The model reads
them from the row (models.physics.hardware.resolve_hardware) and nowhere else; a generation the calibration groups do
not know is said to be new (extrapolated) by the predictor, not grouped silently."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from models.core.domains import (ARCH_FAMILIES, GENERATION_GROUP, GENERATION_GROUPS, PRECISION_FAMILIES,
                                 SOFTWARE_ERAS, Domain, generation_group)
from models.core.params import DEFAULT
from models.corpus.runs_adapter import spans_hosts
from models.fitting.predictor import FEATURE_NAMES, Calibration, predict
from models.physics.hardware import (COUNT_COLUMNS, HOST_COLUMN, LINK_COLUMN, LINK_KINDS, SCALEUP_DOMAIN_COLUMN,
                                     HardwareSpecError, link_kind, resolve_hardware)
from pipeline import catalog
from pipeline.predict_runs import stated_otherwise

MEAS = Path(__file__).resolve().parents[1] / "measurements"

#: rows whose generation no calibration group holds: AWS Trainium (their predictions are extrapolated). A new row of
#: a new generation joins a group in models.core.domains.GENERATION_GROUP, or this list, on purpose.
NEW_GENERATION_ROWS = {"trn1", "trn2"}
#: rows with no sourced server layout (DATA_CARD.md): the scale-up domain falls back to 8 (flagged), no host size
NO_SOURCED_LAYOUT = {"gtx-1080-ti", "a800-sxm4-80gb", "rtx-4090", "l40s", "t4", "l4", "mi250", "mi210",
                     "v100-pcie-16gb", "v100-pcie-32gb", "rtx-a6000", "rtx-3090", "a10", "a40", "l40", "mi100"}
#: rows with no SM count in a spec sheet: equivalent SMs from the 16-bit peak (flagged)
NO_SOURCED_SM_COUNT = {"h20", "l4", "trn1", "trn2"}


@pytest.fixture(scope="module")
def table() -> pl.DataFrame:
    return catalog.hardware(MEAS)


@pytest.fixture(scope="module")
def hw(table) -> pl.DataFrame:
    return resolve_hardware(table, strict=False)


def _row(frame: pl.DataFrame, hid: str) -> dict:
    return frame.filter(pl.col("id") == hid).row(0, named=True)


# ---------------------------------------------------------------- generations

def test_every_accelerator_is_in_a_generation_group_or_is_new(table, hw):
    """Each row's `generation` maps to a calibration group (models.core.domains), except the rows declared new, which
    resolve to 'unknown'."""
    groups = {hid: generation_group(gen) for hid, gen in zip(table["id"], table["generation"])}
    assert {hid for hid, g in groups.items() if g == "unknown"} == NEW_GENERATION_ROWS
    assert set(groups.values()) - {"unknown"} <= set(GENERATION_GROUPS)
    assert set(table["generation"]) - set(GENERATION_GROUP) == {_row(table, h)["generation"] for h in
                                                                NEW_GENERATION_ROWS}
    codes = dict(zip(hw["id"], hw["generation_code"]))
    assert all(GENERATION_GROUPS[int(codes[hid])] == g for hid, g in groups.items())


def _frame(hw_row: dict) -> pl.DataFrame:
    """One 8-GPU data-parallel Llama 3 8B configuration (BF16) on the hardware row."""
    res = resolve_hardware(pl.DataFrame([hw_row]), strict=False).row(0, named=True)
    arch = catalog.find_architecture(MEAS, "llama3-8b")
    row = {k: arch.get(k) for k in catalog.ARCH_MODEL_COLUMNS}
    row.update(seq_len=4096, global_batch_seqs=64, micro_batch=1, n_gpus=8, tp=1, pp=1, dp=8, cp=1, ep=1, vpp=1,
               sharding="zero1", recompute="selective", sequence_parallel=False, dtype="bf16", gpus_per_node=8)
    return pl.DataFrame([row]).hstack(pl.DataFrame([{k: v for k, v in res.items() if k not in row}]))


def test_a_new_generation_is_said_to_be_new_by_the_predictor(table):
    """A fit that saw every generation group: a configuration on an H100 row is inside its domain, the same row
    under an invented generation (and every row declared new) is extrapolated, and the prediction says why."""
    n_f = len(FEATURE_NAMES)
    dom = Domain.of([g for g in GENERATION_GROUPS if g != "unknown"], PRECISION_FAMILIES, SOFTWARE_ERAS, [1e6],
                    ARCH_FAMILIES)
    fit = Calibration("test", DEFAULT, {}, dom, "physics", np.zeros(n_f), np.ones(n_f), np.zeros(n_f), 0.0, 0.1,
                      0.3)
    h100 = _row(table, "h100-sxm5-80gb")
    invented = dict(h100, id="rubin-test", name="Invented Rubin part", generation="Rubin")
    rows = [h100, invented] + [_row(table, h) for h in sorted(NEW_GENERATION_ROWS)]
    out = pl.concat([predict(_frame(r), fit) for r in rows])
    domain = out["calibration_domain"].to_list()
    assert domain[0] == "inside"
    for text in domain[1:]:
        assert text.startswith("extrapolated: hardware generation unknown not in the fit"), text
    assert out["step_time_hi_s"][1] / out["step_time_s"][1] > out["step_time_hi_s"][0] / out["step_time_s"][0]


# ---------------------------------------------------------------- scale-up domain, host, link

def test_every_row_has_a_positive_scale_up_domain_and_host_size(table, hw):
    """The resolved scale-up domain is positive on every row; the table states it (and one host's accelerators, a
    whole number >= 1 that fits in the domain) on every row with a sourced layout, and the rows without one take the
    documented default (8, flagged)."""
    assert (hw["scaleup_size"] > 0).all() and hw["scaleup_size"].null_count() == 0
    stated = table.filter(pl.col(SCALEUP_DOMAIN_COLUMN).is_not_null())
    assert set(table["id"]) - set(stated["id"]) == NO_SOURCED_LAYOUT
    assert stated[HOST_COLUMN].null_count() == 0
    assert table.filter(pl.col(SCALEUP_DOMAIN_COLUMN).is_null())[HOST_COLUMN].null_count() == len(NO_SOURCED_LAYOUT)
    for c in COUNT_COLUMNS:
        v = stated[c].cast(pl.Float64)
        assert ((v >= 1) & (v == v.floor())).all(), c
    assert (stated[HOST_COLUMN] <= stated[SCALEUP_DOMAIN_COLUMN]).all()
    for r in hw.iter_rows(named=True):
        assert r["scaleup_size_fallback"] == (r["id"] in NO_SOURCED_LAYOUT), r["id"]
        assert r["scaleup_size"] == (8.0 if r["id"] in NO_SOURCED_LAYOUT else r[SCALEUP_DOMAIN_COLUMN]), r["id"]


def test_a_domain_spans_hosts_on_tpu_pods_and_nvl72_racks_only(hw):
    """A scale-up domain larger than one host: the TPU pods (ICI) and the GB200/GB300 NVL72 racks (4 GPUs per compute
    tray); every other stated domain is one host."""
    spanning = hw.filter(spans_hosts(pl.col("scaleup_size"), pl.col(HOST_COLUMN)).fill_null(False))["id"]
    assert set(spanning) == {h for h in hw["id"] if h.startswith("tpu-")} | {"gb200", "gb300"}
    assert _row(hw, "gb200")[HOST_COLUMN] == _row(hw, "gb300")[HOST_COLUMN] == 4
    assert _row(hw, "tpu-v7")["scaleup_size"] == 9216 and _row(hw, "tpu-v7")[HOST_COLUMN] == 4


def test_a_node_count_is_read_with_the_host_size(table):
    """`predict --runs` reads a node count as nodes x one host's accelerators: 64 GB200 nodes are 256 GPUs (4 per
    compute tray), 16 TPU v5p hosts 64 chips, 8 H100 nodes 64 GPUs; a part without a sourced layout gets no count."""
    unstated = {c: pl.Series([None] * 4, dtype=pl.Int64) for c in ("n_gpus", "gpus_per_node", "tp", "pp", "dp", "cp")}
    runs = pl.DataFrame({"gpu": ["gb200", "tpu-v5p", "h100-sxm5-80gb", "rtx-4090"], "_nodes": [64.0, 16.0, 8.0, 2.0],
                         **unstated})
    out, _ = stated_otherwise(runs, table, [])
    assert out["n_gpus"].to_list() == [256, 64, 64, None]


def test_the_link_kind_is_stated_and_agrees_with_the_link_text(table, hw):
    """`scaleup_link` is one of the kinds the model knows, or empty for a link none of them (AWS NeuronLink), and
    says what the row's `intra_node_link` prose says; the model takes the column."""
    kinds = dict(zip(table["id"], table[LINK_COLUMN]))
    assert set(kinds.values()) <= set(LINK_KINDS) | {None}
    assert {h for h, k in kinds.items() if k is None} == {"trn1", "trn2"}
    for hid, text in zip(table["id"], table["intra_node_link"]):
        assert link_kind(text) == kinds[hid], hid
    assert dict(zip(hw["id"], hw["scaleup_link"])) == kinds


def test_every_stated_fact_names_its_source(table):
    """Each filled fact column is named in the row's `source_ref` ("column: source"), and every column of the table
    is described in measurements/DATA_CARD.md."""
    for c in (SCALEUP_DOMAIN_COLUMN, HOST_COLUMN, LINK_COLUMN):
        for hid, v, src in table.select("id", c, "source_ref").iter_rows():
            if v is not None:
                assert re.search(rf"\b{c}\b", src), (hid, c)
    card = (MEAS / "DATA_CARD.md").read_text()
    section = card[card.index("## `hardware_specs.csv`"):card.index("## `instance_networks.csv`")]
    assert not [c for c in table.columns if f"`{c}`" not in section]


# ---------------------------------------------------------------- SM count

def test_the_model_uses_the_table_s_sm_count(table, hw):
    """The SM count the model uses (the GEMM-size ramp) is the table's wherever the table states one (GB200: 152);
    the rows without one take equivalent SMs from the 16-bit peak, flagged."""
    used = dict(zip(hw["id"], hw["sm_count"]))
    flagged = {h for h, f in zip(hw["id"], hw["sm_count_fallback"]) if f}
    assert flagged == NO_SOURCED_SM_COUNT
    for hid, sm in zip(table["id"], table["sm_count"]):
        if hid not in NO_SOURCED_SM_COUNT:
            assert used[hid] == float(sm), hid
    assert used["gb200"] == 152 and used["b200"] == 148


# ---------------------------------------------------------------- refusals and a row without the facts

@pytest.mark.parametrize("column, value", [(SCALEUP_DOMAIN_COLUMN, "72.5"), (SCALEUP_DOMAIN_COLUMN, "seventy-two"),
                                           (HOST_COLUMN, "0"), (LINK_COLUMN, "infiniband")])
def test_a_stated_fact_that_is_not_one_is_refused(column, value):
    """A domain or host size that is not a whole number >= 1, or a link kind the model does not know, is refused like
    a missing required value: an error naming the id and column (strict), or the row's `hardware_error`."""
    raw = pl.read_csv(MEAS / "hardware_specs.csv", infer_schema_length=0).filter(pl.col("id") == "gb200")
    bad = raw.with_columns(pl.lit(value).alias(column))
    with pytest.raises(HardwareSpecError, match=f"gb200.*{column}") as err:
        resolve_hardware(bad)
    assert err.value.column == column
    assert column in resolve_hardware(bad, strict=False)["hardware_error"][0]


def test_a_row_without_the_facts_reads_its_node_and_link_words(table):
    """A hardware row that states no scale-up domain, host size or link kind (a hand-written hardware file): the
    domain is its typical node (gpus_per_node_typical), the link kind the words of its `intra_node_link`; with
    neither, the default domain of 8 (flagged) and the NVLink-class tier."""
    row = {k: v for k, v in _row(table, "gb200").items() if k not in (SCALEUP_DOMAIN_COLUMN, HOST_COLUMN, LINK_COLUMN)}
    r = resolve_hardware(pl.DataFrame([row]), strict=False).row(0, named=True)
    assert r["hardware_error"] is None and r["scaleup_size"] == 72 and not r["scaleup_size_fallback"]
    assert r["scaleup_link"] == "nvlink" and r[HOST_COLUMN] is None
    pcie = row | {"intra_node_link": "PCIe Gen4 x16", "gpus_per_node_typical": None}
    r = resolve_hardware(pl.DataFrame([pcie]), strict=False).row(0, named=True)
    assert r["scaleup_size"] == 8 and r["scaleup_size_fallback"] and r["scaleup_link"] == "pcie"
    bare = pcie | {"intra_node_link": "custom fabric"}
    r = resolve_hardware(pl.DataFrame([bare]), strict=False).row(0, named=True)
    assert r["scaleup_link"] is None and r["scaleup_link_code"] is None
