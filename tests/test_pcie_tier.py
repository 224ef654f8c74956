"""The PCIe/host scale-up tier (docs/model.md, "Hardware"): parts whose accelerators talk over PCIe use
`PhysParams.pcie_eff` and `alpha_pcie_s`, never the NVLink-class `scaleup_eff` / `alpha_scaleup_s`, and the other
way round."""

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from models.fitting.assumptions import params_for
from models.fitting.calibration import FIT_FIELDS
from models.physics.hardware import LINK_CODES, PCIE_LINK_CODE, hardware_arrays, is_pcie, link_kind, resolve_hardware
from models.core.params import DEFAULT, FITTABLE_BOUNDS
from models.planning.search import enumerate_layouts
from models.physics.step_time import HARDWARE_COLUMNS, predict_arrays
from pipeline import catalog

MEAS = Path(__file__).resolve().parents[1] / "measurements"


@pytest.fixture(scope="module")
def hw():
    return resolve_hardware(pl.read_csv(MEAS / "hardware_specs.csv", infer_schema_length=0), strict=False)


def row(hw, hid):
    return hw.filter(pl.col("id") == hid).row(0, named=True)


def layouts(h, arch="llama3-8b", n=32, batch=128, seq=4096):
    """Every layout of `arch` on n accelerators `h` (dict of arrays for predict_arrays)."""
    return enumerate_layouts(catalog.find_architecture(MEAS, arch), h, n, batch, seq)


def test_link_kind_from_the_table(hw):
    kinds = dict(zip(hw["id"].to_list(), hw["scaleup_link"].to_list()))
    for hid in ("gtx-580", "gtx-580-3gb", "gtx-1080-ti", "k80", "a100-pcie-80gb", "h100-pcie-80gb", "h100-nvl-94gb",
                "l40s", "rtx-4090", "a100-pcie-40gb", "t4", "l4", "mi210", "v100-pcie-16gb", "v100-pcie-32gb",
                "rtx-a6000", "rtx-3090", "a10", "a40", "l40", "mi100"):
        assert kinds[hid] == "pcie", hid
    assert kinds["h100-sxm5-80gb"] == kinds["gb200"] == kinds["p100-sxm2-16gb"] == kinds["gh200"] == "nvlink"
    assert kinds["mi300x"] == kinds["mi250x"] == kinds["mi250"] == "xgmi"
    assert kinds["trn1"] is None and kinds["trn2"] is None  # NeuronLink is none of the modelled link kinds
    assert kinds["tpu-v4"] == kinds["tpu-v5p"] == kinds["tpu-v2"] == kinds["tpu-v7"] == "ici"
    assert kinds["h20"] == kinds["b100"] == "nvlink"
    assert kinds["gaudi2"] == "ethernet"
    # a PCIe card with an optional NVLink bridge pair talks over PCIe beyond the pair (and its bandwidth column
    # is the PCIe link)
    assert link_kind("PCIe Gen5 x16 (optional NVLink bridge pairs: 600 GB/s bidirectional)") == "pcie"
    assert link_kind("") is None and link_kind(None) is None and link_kind("a custom fabric") is None
    codes = hardware_arrays(hw)["scaleup_link_code"]
    assert is_pcie(codes).sum() == 21 and not is_pcie(np.nan)
    assert LINK_CODES["pcie"] == PCIE_LINK_CODE and "scaleup_link_code" in HARDWARE_COLUMNS


def test_pcie_tier_params_are_priors_and_ideal_reaches_the_link():
    assert "pcie_eff" not in FITTABLE_BOUNDS and "alpha_pcie_s" not in FITTABLE_BOUNDS
    assert "pcie_eff" not in FIT_FIELDS and "alpha_pcie_s" not in FIT_FIELDS
    p = params_for("ideal", DEFAULT)
    assert p.pcie_eff == p.scaleup_eff == 1.0 and p.alpha_pcie_s == DEFAULT.alpha_pcie_s  # latency stays


def test_pcie_row_pays_the_pcie_tier_and_nvlink_row_does_not(hw):
    """Same card, link code PCIe or NVLink: each row moves only with its own tier's constants, and the PCIe row
    equals the NVLink row computed with the PCIe constants put in the NVLink slots (bit for bit)."""
    a = layouts(row(hw, "a100-pcie-80gb"))
    n = len(a["tp"])
    pcie = a | {"scaleup_link_code": np.full(n, float(PCIE_LINK_CODE))}
    nvl = a | {"scaleup_link_code": np.full(n, float(LINK_CODES["nvlink"]))}
    P = DEFAULT.with_(pcie_eff=0.5, alpha_pcie_s=20e-6)
    base_p, base_n = predict_arrays(pcie, P), predict_arrays(nvl, P)
    comm = ("tp_comm_s", "dp_comm_exposed_s", "step_time_s")
    ok = base_p["error_code"] == 0
    assert ok.sum() > 100
    # the PCIe row pays its tier: more than the NVLink-class constants would charge on the same link
    assert np.any(base_p["tp_comm_s"][ok] > base_n["tp_comm_s"][ok])
    moved_nvl = predict_arrays(pcie, P.with_(scaleup_eff=0.3, alpha_scaleup_s=1e-4))
    moved_pcie = predict_arrays(nvl, P.with_(pcie_eff=0.3, alpha_pcie_s=1e-4))
    for k in comm:
        assert np.array_equal(moved_nvl[k], base_p[k], equal_nan=True), k  # NVLink constants: no effect on PCIe
        assert np.array_equal(moved_pcie[k], base_n[k], equal_nan=True), k  # PCIe constants: no effect on NVLink
    as_nvl = predict_arrays(nvl, P.with_(scaleup_eff=P.pcie_eff, alpha_scaleup_s=P.alpha_pcie_s))
    for k in comm:
        assert np.array_equal(as_nvl[k], base_p[k], equal_nan=True), k
    # mixed blocks: a row's tier is its own (every other row of the block NVLink-class)
    mixed = a | {"scaleup_link_code": np.where(np.arange(n) % 2 == 0, float(PCIE_LINK_CODE), np.nan)}
    out = predict_arrays(mixed, P)
    even = np.arange(n) % 2 == 0
    assert np.array_equal(out["step_time_s"][even], base_p["step_time_s"][even], equal_nan=True)
    assert np.array_equal(out["step_time_s"][~even], base_n["step_time_s"][~even], equal_nan=True)


@pytest.mark.parametrize("gpu", ["gtx-1080-ti", "rtx-4090", "h100-pcie-80gb"])
def test_more_pcie_bandwidth_never_slows_a_step(hw, gpu):
    h = row(hw, gpu)
    a = layouts(h, n=64)
    slow = predict_arrays(a)
    fast = predict_arrays(a | {"intra_node_bw_gbps": a["intra_node_bw_gbps"] * 2.0})
    ok = slow["error_code"] == 0
    assert ok.sum() > 100
    assert np.all(fast["step_time_s"][ok] <= slow["step_time_s"][ok])
    assert np.any(fast["step_time_s"][ok] < slow["step_time_s"][ok])


def test_the_nic_shares_the_pcie_link(hw):
    """On a PCIe part the NIC sits behind the card's PCIe link: a faster NIC than the link buys nothing once the
    link binds (collectives across nodes get min(link, ranks per node x NIC); PP p2p min(link, NIC))."""
    h = row(hw, "l40s")
    a = layouts(h, n=64)
    n = len(a["tp"])
    one = predict_arrays(a | {"inter_node_bw_gbps": np.full(n, 1e3)})
    two = predict_arrays(a | {"inter_node_bw_gbps": np.full(n, 1e4)})
    assert np.array_equal(one["step_time_s"], two["step_time_s"], equal_nan=True)
