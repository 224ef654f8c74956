"""The network as a list of tiers (models.physics.network): what ``build`` lists, what a group pays, and that the
step-time model reads the list whatever its length (a tier that adds nothing changes no output bit)."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from models.core.params import DEFAULT
from models.physics import collectives as coll
from models.physics import network
from models.physics.hardware import resolve_hardware
from models.physics.network import Tier
from models.physics.step_time import HARDWARE_COLUMNS, predict_arrays

ROOT = Path(__file__).resolve().parents[1] / "measurements"
HIDS = ("a100-sxm4-80gb", "a100-pcie-80gb", "h100-sxm5-80gb", "gb200", "tpu-v5p", "mi300x")
ERR_MEMORY = 1 << 10


@pytest.fixture(scope="module")
def hw():
    table = resolve_hardware(pl.read_csv(ROOT / "hardware_specs.csv", infer_schema_length=0), strict=False)
    return {h: table.filter(pl.col("id") == h).select(HARDWARE_COLUMNS).to_dicts()[0] for h in HIDS}


def tiers_of(row: dict, **network_columns) -> tuple[Tier, ...]:
    """The tiers ``build`` lists for one configuration row (its hardware columns, n_gpus, the network columns)."""
    a = {k: np.array([np.nan if v is None else float(v)]) for k, v in (row | network_columns).items()}
    col = lambda k: a.get(k, np.array([np.nan]))  # noqa: E731
    return network.build(network.decode(col, a["n_gpus"]), DEFAULT)


def random_block(hw, seed: int, n: int = 1500) -> dict[str, np.ndarray]:
    """n random configurations (dense and MoE; tp, cp, ep, dp, pp, vpp, sharding, 1-D and 2-D TP) on the accelerators
    of HIDS, 8 per node, up to 2,048 of them, half with a pod tier (pods of 16-256, 1:1 to 4:1); some are invalid."""
    rng = np.random.default_rng(seed)
    pick = lambda vals: rng.choice(np.asarray(vals, dtype=float), n)  # noqa: E731
    archs = np.array([  # L, h, heads, kv, ffn, vocab, act, E, top_k
        (24, 2048, 16, 16, 8192, 51200, 0, 0, 0),
        (32, 4096, 32, 8, 14336, 128256, 1, 0, 0),
        (32, 4096, 32, 8, 14336, 32000, 1, 8, 2),
        (48, 4096, 32, 4, 12288, 102400, 1, 64, 6)], dtype=float)
    A = archs[rng.integers(0, len(archs), n)]
    tp, pp, cp, dp = pick([1, 2, 4, 8, 16]), pick([1, 2, 4, 8]), pick([1, 1, 2]), pick([1, 2, 4, 8, 16, 32, 64])
    mb, m = pick([1, 2]), pick([4, 8, 16])
    moe = A[:, 7] > 0
    a = dict(n_layers=A[:, 0], d_model=A[:, 1], n_heads=A[:, 2], n_kv_heads=A[:, 3], ffn_dim=A[:, 4], vocab=A[:, 5],
             activation=A[:, 6].astype(np.int64), n_experts=A[:, 7], top_k=A[:, 8], expert_ffn_dim=A[:, 4] / 4,
             seq_len=pick([2048, 4096]), global_batch_seqs=dp * mb * m, micro_batch=mb, n_gpus=tp * pp * cp * dp,
             tp=tp, pp=pp, dp=dp, cp=cp, ep=np.where(moe, np.minimum(pick([1, 2, 4, 8]), dp), 1.0),
             vpp=np.where((pp > 1) & (m % pp == 0), pick([1, 2]), 1.0), sharding=rng.integers(0, 6, n),
             recompute=rng.integers(0, 3, n), sequence_parallel=rng.random(n) < 0.5, dtype=rng.integers(0, 2, n),
             tp_mode=((rng.random(n) < 0.3) & (tp >= 4)).astype(np.int64), gpus_per_node=np.full(n, 8.0),
             oversubscription=np.where(rng.random(n) < 0.5, pick([1, 2, 3, 4]), np.nan),
             pod_size=pick([np.nan, 16, 64, 256]))
    hi = rng.integers(0, len(HIDS), n)
    for c in HARDWARE_COLUMNS:
        a[c] = np.array([np.nan if hw[h][c] is None else float(hw[h][c]) for h in HIDS])[hi]
    return a


def valid(out) -> np.ndarray:
    return out["error_code"] & ~ERR_MEMORY == 0


def same_bits(r1, r2) -> list[str]:
    """The output arrays that differ in any bit."""
    return [k for k in r1 if r1[k].dtype != r2[k].dtype or r1[k].tobytes() != r2[k].tobytes()]


def patched_build(monkeypatch, change):
    """``network.build`` followed by ``change(tiers) -> tiers``, for the step-time model; returns the lists built."""
    build, built = network.build, []

    def build_then_change(cols, P):
        tiers = change(build(cols, P))
        built.append(tiers)
        return tiers
    monkeypatch.setattr(network, "build", build_then_change)
    return built


# ------------------------------------------------------------------------------------------ the list

def test_a_plain_row_has_two_tiers_and_a_row_with_a_pod_tier_three(hw):
    h100 = hw["h100-sxm5-80gb"] | {"n_gpus": 512, "gpus_per_node": 8}
    up, out = h100["intra_node_bw_gbps"] * 1e9, h100["inter_node_bw_gbps"] * 1e9
    plain = tiers_of(h100)
    assert [t.name for t in plain] == ["scale-up", "scale-out"]
    assert plain[0].accelerators[0] == 8 and plain[1].accelerators == np.inf
    assert plain[0].bw_Bps[0] == up * DEFAULT.scaleup_eff and plain[0].alpha_s == DEFAULT.alpha_scaleup_s
    assert plain[1].bw_Bps[0] == out * DEFAULT.scaleout_eff and plain[1].a2a_bw_Bps[0] == out * coll.A2A_RDMA_EFF
    assert plain[1].alpha_s == DEFAULT.alpha_scaleout_s
    pods = tiers_of(h100, pod_size=64, oversubscription=3)
    assert [t.name for t in pods] == ["scale-up", "scale-out", "above the pods"]
    assert pods[1].accelerators[0] == 64 and pods[2].accelerators == np.inf and pods[2].oversubscription[0] == 3.0
    assert pods[2].bw_Bps[0] == pods[1].bw_Bps[0]  # the same NICs, their share divided where a group crosses
    # no pod boundary: every hop that leaves the domain crosses the oversubscribed tier
    assert tiers_of(h100, oversubscription=3)[1].accelerators[0] == 8
    # nothing to charge: a non-blocking pod tier, or pods that hold the whole job
    assert len(tiers_of(h100, pod_size=64, oversubscription=1)) == 2
    assert len(tiers_of(h100, pod_size=512, oversubscription=3)) == 2


def test_pcie_rows_get_the_pcie_host_tier(hw):
    card = tiers_of(hw["a100-pcie-80gb"] | {"n_gpus": 16, "gpus_per_node": 8})
    assert card[0].bw_Bps[0] == hw["a100-pcie-80gb"]["intra_node_bw_gbps"] * 1e9 * DEFAULT.pcie_eff
    assert card[0].alpha_s[0] == DEFAULT.alpha_pcie_s


# ------------------------------------------------------------------------------------------ what a group pays

def test_a_group_inside_the_domain_pays_only_the_scale_up_tier():
    """Outer tiers without a usable bandwidth or latency (NaN) do not reach a group that fits in one domain."""
    nan = np.full(5, np.nan)
    tiers = (Tier("scale-up", np.full(5, 8.0), np.full(5, 300e9), np.full(5, 280e9), 3e-6),
             Tier("scale-out", np.full(5, 64.0), nan, nan, np.nan), Tier("above", np.inf, nan, nan, np.nan, 3.0))
    n = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    bw, alpha = network.ring_link(tiers, n)
    assert bw[:4].tolist() == [300e9] * 4 and alpha[:4].tolist() == [3e-6] * 4 and np.isnan(bw[4])
    # 2 ranks 4 apart share a domain of 8; 4 ranks 4 apart do not
    bw, alpha = network.ring_link(tiers, np.array([2.0, 2.0, 2.0, 2.0, 4.0]), 4.0)
    assert bw[:4].tolist() == [300e9] * 4 and np.isnan(bw[4])
    inside = np.array([1.0, 2.0, 4.0, 8.0, 8.0])
    assert np.array_equal(coll.ep_all_to_all(tiers, 1e8, inside), coll.all_to_all_time(1e8, inside, 280e9, 3e-6))
    bw, alpha = network.p2p_link(tiers, 4.0, np.array([1.0, 2.0, 4.0, 7.0, 8.0]))  # the next stage: 7 apart is in
    assert bw[:4].tolist() == [300e9] * 4 and alpha[:4].tolist() == [3e-6] * 4 and np.isnan(bw[4])


def test_a_single_domain_job_ignores_every_outer_tier(hw):
    a = random_block(hw, seed=1)
    one = a["n_gpus"] <= 8
    assert one.sum() > 100
    base = predict_arrays(a)
    slow = a | {"inter_node_bw_gbps": a["inter_node_bw_gbps"] / 7.0, "oversubscription": np.full(len(one), 4.0)}
    other = predict_arrays(slow)
    for k in base:
        assert np.array_equal(base[k][one], other[k][one], equal_nan=True), k


def test_four_tiers_by_hand():
    """A rack tier between the domain and an oversubscribed data centre: min(scale-up, g x the slowest tier reached /
    its oversubscription), at the latency of the outermost tier reached."""
    tiers = (Tier("scale-up", 8.0, 300e9, 300e9, 3e-6), Tier("rack", 32.0, 50e9, 40e9, 5e-6),
             Tier("data centre", np.inf, 40e9, 30e9, 1e-5, 2.0))
    bw, alpha = network.ring_link(tiers, np.array([8.0, 16.0, 32.0, 64.0]))
    assert bw.tolist() == [300e9, 300e9, 300e9, 8 * 20e9] and alpha.tolist() == [3e-6, 5e-6, 5e-6, 1e-5]
    bw, alpha = network.ring_link(tiers, np.array([4.0, 8.0]), 8.0)  # one rank per domain: 4 fit in a rack
    assert bw.tolist() == [50e9, 20e9] and alpha.tolist() == [5e-6, 1e-5]
    assert network.outer_bw(tiers, np.array([4.0, 8.0]), 8.0, "a2a_bw_Bps").tolist() == [40e9, 15e9]
    bw, alpha = network.p2p_link(tiers, np.array([2.0, 8.0]), 8.0)
    assert bw.tolist() == [50e9, 20e9] and alpha.tolist() == [5e-6, 1e-5]


def test_the_links_form_is_the_tier_list():
    """``collectives.group_link`` and ``ep_all_to_all_time`` (the network given by its links) are the tier list's."""
    rng = np.random.default_rng(0)
    n, g = rng.choice([2.0, 8.0, 16.0, 64.0], 200), rng.choice([1.0, 4.0, 8.0], 200)
    stride, pods = rng.choice([1.0, 2.0, 8.0], 200), (rng.choice([16.0, 64.0], 200), rng.uniform(1.0, 4.0, 200))
    tiers = network.of_links(np.nan, 300e9, 25e9, 3e-6, 1e-5, pods=pods)
    for a, b in zip(coll.group_link(n, g, 300e9, 25e9, 3e-6, 1e-5, stride, pods),
                    network.ring_link(tiers, n, stride, g)):
        assert np.array_equal(a, b)
    assert np.array_equal(coll.ep_all_to_all_time(1e8, n, g, 300e9, 25e9, 3e-6, 1e-5, stride, pods),
                          coll.ep_all_to_all(tiers, 1e8, n, stride, g))


# ------------------------------------------------------------------------------------------ the model reads the list

@pytest.mark.parametrize("tier", [0, 1, 2])
def test_more_bandwidth_on_any_tier_never_slows_a_step(hw, monkeypatch, tier):
    a = random_block(hw, seed=10 + tier)
    base = predict_arrays(a)
    ok = valid(base)
    assert ok.sum() > 700
    k = 1.0 + 3.0 * np.random.default_rng(tier).random(len(ok))

    def faster(tiers):
        if tier >= len(tiers):
            return tiers
        t = tiers[tier]
        return tiers[:tier] + (replace(t, bw_Bps=t.bw_Bps * k, a2a_bw_Bps=t.a2a_bw_Bps * k),) + tiers[tier + 1:]
    built = patched_build(monkeypatch, faster)
    fast = predict_arrays(a)
    assert any(len(t) > tier for t in built)
    assert np.array_equal(fast["error_code"], base["error_code"])
    assert np.all(fast["step_time_s"][ok] <= base["step_time_s"][ok] * (1 + 1e-12))
    assert np.mean(fast["step_time_s"][ok] < base["step_time_s"][ok]) > 0.05  # it does bite


@pytest.mark.parametrize("where", ["rack", "data centre"])
def test_an_extra_tier_as_fast_as_the_scale_out_changes_no_bit(hw, monkeypatch, where):
    """A fourth tier is one more entry in the list: a non-blocking tier at the scale-out's bandwidth and latency, a
    rack of 4 domains between the domain and the scale-out network, or a data centre above blocks of 256
    accelerators, gives every output array bit for bit (its bandwidths are copies, so the comparisons run)."""
    with_pods = random_block(hw, seed=3)
    plain = {k: v for k, v in with_pods.items() if k not in network.NETWORK_COLUMNS}
    bases = [predict_arrays(a) for a in (plain, with_pods)]
    assert all(valid(base).sum() > 700 for base in bases)

    def extra(tiers):
        out = tiers[1]
        t = Tier(where, np.inf, np.array(out.bw_Bps), np.array(out.a2a_bw_Bps), out.alpha_s)
        if where == "rack":  # joins 4 domains; the scale-out network now joins racks
            return (tiers[0], replace(t, accelerators=4.0 * tiers[0].accelerators)) + tiers[1:]
        return tiers[:-1] + (replace(tiers[-1], accelerators=256.0), t)  # the outermost tier: 256 accelerators
    built = patched_build(monkeypatch, extra)
    for a, base in zip((plain, with_pods), bases):
        assert not same_bits(base, predict_arrays(a))
    assert [len(t) for t in built] == [3, 4]  # the plain network and the one with a pod tier, each with the extra


@pytest.mark.parametrize("where, untouched_gpus", [("rack", 8), ("data centre", 256)])
def test_a_slower_extra_tier_slows_the_groups_that_reach_it(hw, monkeypatch, where, untouched_gpus):
    """The same extra tier at half the scale-out's bandwidth: every group that leaves its domain crosses the rack
    network; only a group spanning 256-accelerator blocks reaches the data centre. Jobs no group of which reaches
    the tier (at most one domain of 8; at most 256 accelerators) keep every bit."""
    a = random_block(hw, seed=4)
    base = predict_arrays(a)

    def slower(tiers):
        out = tiers[1]
        t = Tier(where, np.inf, out.bw_Bps / 2.0, out.a2a_bw_Bps / 2.0, out.alpha_s)
        if where == "rack":
            return (tiers[0], replace(t, accelerators=4.0 * tiers[0].accelerators)) + tiers[1:]
        return tiers[:-1] + (replace(tiers[-1], accelerators=256.0), t)
    patched_build(monkeypatch, slower)
    slow = predict_arrays(a)
    ok = valid(base)
    apart = a["n_gpus"] <= untouched_gpus
    assert apart.sum() > 50 and (ok & ~apart).sum() > 50
    assert not same_bits({k: v[apart] for k, v in base.items()}, {k: v[apart] for k, v in slow.items()})
    assert np.all(slow["step_time_s"][ok] >= base["step_time_s"][ok])
    assert np.mean(slow["step_time_s"][ok & ~apart] > base["step_time_s"][ok & ~apart]) > 0.3
