"""DeviceMesh: rank layout and group families of named parallel axes.

Expected groups are derived by hand from Megatron-Core's layout
(``megatron/core/parallel_state.py``: ``generate_masked_orthogonal_rank_groups`` and the two
``RankGenerator`` s of ``initialize_model_parallel``): with axes listed innermost first,
``rank = Σ coord_i · stride_i`` (stride = product of the sizes of the inner axes); a group
varies the masked axes (innermost fastest) and rows enumerate the other axes (innermost
fastest). The expert generator uses the same order with ``tp → etp``, ``cp → 1``,
``dp → edp = tp·cp·dp / (etp·ep)``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddlsim.errors import ConfigError
from ddlsim.workloads.gpt import megatron_groups
from ddlsim.workloads.mesh import DeviceMesh
from ddlsim.workloads.trace import GroupFamily


# ---------------------------------------------------------------------- dense layout
@pytest.mark.parametrize("tp,dp,pp", itertools.product((1, 2, 4), (1, 2, 3, 4), (1, 2, 3)))
def test_tp_dp_pp_families_are_megatron_groups(tp, dp, pp):
    mesh = DeviceMesh.from_megatron(tensor_model_parallel_size=tp,
                                    pipeline_model_parallel_size=pp, data_parallel_size=dp)
    want = megatron_groups(tp, dp, pp)
    got = mesh.families()
    assert mesh.world_size == tp * dp * pp
    assert set(got) == set(want)
    for name, fam in want.items():
        assert got[name].kind == fam.kind
        np.testing.assert_array_equal(got[name].members, fam.members)  # same rows, same order


def test_issue_example_order_without_ep_is_gpt3_layout():
    mesh = DeviceMesh.of({"tp": 8, "cp": 1, "ep": 1, "pp": 16, "dp": 8},
                         order=("tp", "cp", "dp", "pp"))
    assert mesh.world_size == 1024
    for name, fam in megatron_groups(8, 8, 16).items():
        np.testing.assert_array_equal(mesh.groups(name), fam.members)


def test_megatron_docstring_16_gpus_tp2_pp4():
    # initialize_model_parallel's docstring: 16 GPUs, tp=2, pp=4 (so dp=2)
    mesh = DeviceMesh.from_megatron(2, 4, 2)
    assert mesh.groups("dp").tolist() == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11],
                                          [12, 14], [13, 15]]
    assert mesh.groups("tp").tolist() == [[2 * i, 2 * i + 1] for i in range(8)]
    assert mesh.groups("pp").tolist() == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14],
                                          [3, 7, 11, 15]]


def test_masked_groups_docstring_examples():
    # generate_masked_orthogonal_rank_groups' docstring: order tp-dp-pp, sizes [2, 3, 4]:
    # dp_group[g] = tp_rank + 2·range(3) + 6·pp_rank with g = tp_rank + 2·pp_rank
    dp = DeviceMesh.of({"tp": 2, "dp": 3, "pp": 4}, "tp-dp-pp").groups("dp")
    assert dp.shape == (8, 3)
    assert dp[0].tolist() == [0, 2, 4] and dp[1].tolist() == [1, 3, 5]
    assert dp[7].tolist() == [19, 21, 23]
    # ... and order tp-pp-dp, sizes 2-2-2: rank = t + 2s + 4d
    mesh = DeviceMesh.of({"tp": 2, "pp": 2, "dp": 2}, "tp-pp-dp")
    assert mesh.groups("dp").tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_context_parallel_and_gradient_group():
    # initialize_model_parallel's docstring: 8 GPUs, tp=4, cp=2 -> cp groups [g0, g4], …
    assert DeviceMesh.from_megatron(4, context_parallel_size=2).groups("cp").tolist() == \
        [[0, 4], [1, 5], [2, 6], [3, 7]]
    # tp=2 cp=2 dp=2: rank = t + 2c + 4d; the gradient group varies (c, d) for fixed t.
    mesh = DeviceMesh.of({"tp": 2, "cp": 2, "dp": 2})
    assert mesh.groups(("dp", "cp")).tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert mesh.groups(("cp", "dp")).tolist() == mesh.groups(("dp", "cp")).tolist()
    assert mesh.groups("dp").tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    fams = mesh.families()
    assert set(fams) == {"tp", "dp", "pp", "cp", "dp_cp"} and fams["dp_cp"].kind == "dp"


# ---------------------------------------------------------------------- expert layout
def test_expert_groups_tp2_dp4_ep2():
    # etp = tp = 2, edp = 2·4/(2·2) = 2; expert order etp-ep-edp: rank = t + 2e + 4d'.
    # ep: vary e, rows (t, d') = (0,0) (1,0) (0,1) (1,1); edp: vary d', rows t + 2e.
    mesh = DeviceMesh.from_megatron(tensor_model_parallel_size=2, data_parallel_size=4,
                                    expert_model_parallel_size=2)
    assert (mesh.size("etp"), mesh.size("edp")) == (2, 2)
    assert mesh.groups("ep").tolist() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert mesh.groups("edp").tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert mesh.groups("etp").tolist() == mesh.groups("tp").tolist()
    assert mesh.groups(("etp", "ep")).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mesh.coords(6, ("etp", "ep", "edp")).tolist() == [0, 1, 1]


def test_expert_groups_etp1_takes_ep_from_tensor_ranks():
    # tp=2 dp=4 ep=2 etp=1: edp = 8/2 = 4; expert order etp(1)-ep-edp: rank = e + 2d'.
    mesh = DeviceMesh.from_megatron(2, 1, 4, expert_model_parallel_size=2,
                                    expert_tensor_parallel_size=1)
    assert mesh.size("edp") == 4
    assert mesh.groups("ep").tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.groups("edp").tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert mesh.groups("etp").shape == (8, 1)


def test_expert_groups_with_pipeline():
    # tp=1 dp=4 pp=2 ep=2: edp = 4/2 = 2; expert order etp(1)-ep-edp-pp: rank = e + 2d' + 4s.
    # ep: vary e, rows d' + 2s; edp: vary d', rows e + 2s; dense dp: rank = d + 4s.
    mesh = DeviceMesh.from_megatron(1, 2, 4, expert_model_parallel_size=2)
    assert mesh.groups("ep").tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.groups("edp").tolist() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert mesh.groups("dp").tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mesh.groups("pp").tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    fams = mesh.families()
    # etp = 1: no expert-TP family; tp_ep (etp × ep, the allgather dispatcher's) is ep here
    assert set(fams) == {"tp", "dp", "pp", "ep", "tp_ep", "edp"}
    assert (fams["ep"].kind, fams["edp"].kind, fams["tp_ep"].kind) == ("ep", "dp", "ep")
    assert fams["tp_ep"].members.tolist() == fams["ep"].members.tolist()


def test_expert_tp_independent_of_tp_folds_ep_over_tp_and_dp():
    # tp=2 dp=4 (8 ranks), etp=1 ep=8: the expert layout etp(1)-ep(8)-edp(1) spans all 8
    # ranks as one EP group (MoE parallel folding: EP need not divide DP = 4)
    mesh = DeviceMesh.from_megatron(2, 1, 4, expert_model_parallel_size=8,
                                    expert_tensor_parallel_size=1)
    assert mesh.groups("ep").tolist() == [list(range(8))]
    assert (mesh.size("edp"), mesh.size("etp")) == (1, 1)
    assert set(mesh.families()) == {"tp", "dp", "pp", "ep", "tp_ep", "edp"}


def test_expert_groups_with_context_parallel():
    # tp=2 cp=2 dp=2 ep=2: edp = 8/(2·2) = 2, cp folds away: rank = t + 2e + 4d'.
    mesh = DeviceMesh.of({"tp": 2, "cp": 2, "dp": 2, "ep": 2})
    assert mesh.groups("ep").tolist() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert mesh.groups("edp").tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_order_that_moves_stages_between_layouts_is_rejected():
    # order tp-ep-pp-dp with pp=2 dp=4 ep=2: dense rank = s + 2d puts rank 1 in stage 1,
    # expert rank = e + 2s + 4d' puts it in stage 0 (Megatron asserts pp groups agree).
    with pytest.raises(ConfigError, match="pipeline stages"):
        DeviceMesh.of({"pp": 2, "dp": 4, "ep": 2}, "tp-ep-pp-dp")
    # with edp = dp (ep·etp = tp·cp) the stages agree, as Megatron allows
    mesh = DeviceMesh.of({"tp": 2, "pp": 2, "dp": 2, "ep": 2, "etp": 1}, "tp-ep-pp-dp")
    assert mesh.size("edp") == 2


# ---------------------------------------------------------------------- API and errors
def test_aliases_order_strings_and_coords():
    a = DeviceMesh.of({"tensor_model_parallel_size": 2, "data_parallel_size": 2, "pp": 2})
    b = DeviceMesh.from_megatron(2, 2, 2, order="tp-cp-ep-dp-pp")
    assert a == b and hash(a) == hash(b)
    assert a.order == ("tp", "cp", "ep", "dp", "pp")
    # rank 6 = t + 2d + 4s with (t, d, s) = (0, 1, 1); dense axes tp cp dp pp
    assert a.coords(6).tolist() == [0, 0, 1, 1]
    assert a.coords([6, 7], ("pp", "tp")).tolist() == [[1, 0], [1, 1]]
    assert int(a.rank_of([1, 0, 1, 1])) == 7
    assert "tp=2" in str(a) and "8 ranks" in str(a)
    fam = a.family("grad", "dp", ("dp",))
    assert isinstance(fam, GroupFamily) and fam.name == "grad" and fam.size == 2
    with pytest.raises(ValueError):
        a.groups("tp")[0, 0] = 5  # read-only


@pytest.mark.parametrize("sizes,order,fragment", [
    ({"tq": 2}, "tp-cp-ep-dp-pp", "did you mean 'tp'"),
    ({"tensor_parallel_size": 2}, "tp-cp-ep-dp-pp", "did you mean 'tensor_model_parallel_size'"),
    ({"tp": 0}, "tp-cp-ep-dp-pp", "integer ≥ 1"),
    ({"dp": 2.5}, "tp-cp-ep-dp-pp", "integer ≥ 1"),
    ({"dp": True}, "tp-cp-ep-dp-pp", "integer ≥ 1"),
    ({"tp": 2}, "tp-cp-tp", "repeated: ['tp']"),
    ({"tp": 2, "dp": 2}, "dp-pp", "missing: ['tp']"),
    ({"tp": 2}, "etp-dp", "tp's and dp's places"),
    ({"tp": 2}, "tp-dq", "did you mean 'dp'"),
    ({"tp": 2, "dp": 3, "ep": 2}, "tp-cp-ep-dp-pp", "= 4 must divide"),
    ({"tp": 2, "tensor_model_parallel_size": 2}, "tp-cp-ep-dp-pp", "sized twice"),
])
def test_bad_plans_raise_one_paragraph(sizes, order, fragment):
    with pytest.raises(ConfigError) as err:
        DeviceMesh.of(sizes, order)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_bad_queries_raise_config_errors():
    mesh = DeviceMesh.from_megatron(2, 1, 4, expert_model_parallel_size=2)
    with pytest.raises(ConfigError, match="did you mean 'tp'"):
        mesh.groups("tpp")
    with pytest.raises(ConfigError, match="one layout"):
        mesh.groups(("tp", "ep"))
    with pytest.raises(ConfigError, match="each once"):
        mesh.groups(("tp", "tp"))
    with pytest.raises(ConfigError, match="outside 0..7"):
        mesh.coords(8)
    with pytest.raises(ConfigError, match="missing"):
        mesh.rank_of([0], ("tp",))
    with pytest.raises(ConfigError, match="0..size-1"):
        mesh.rank_of([2, 0, 0, 0])
    with pytest.raises(ConfigError, match="each axis once"):
        mesh.coords(0, ("tp", "tp"))


# ---------------------------------------------------------------------- properties
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def meshes(draw):
    tp, cp, dp, pp = (draw(st.integers(1, 4)) for _ in range(4))
    inner = tp * cp * dp
    ep = draw(st.sampled_from(_divisors(inner)))
    etp = draw(st.sampled_from(_divisors(inner // ep)))
    rest = draw(st.permutations(["tp", "cp", "ep", "dp"]))
    return DeviceMesh.of({"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": ep, "etp": etp},
                         (*rest, "pp"))


@settings(max_examples=60, deadline=None)
@given(meshes())
def test_mesh_properties(mesh):
    s, ranks = mesh.sizes, np.arange(mesh.world_size)
    assert mesh.world_size == s["tp"] * s["cp"] * s["dp"] * s["pp"]
    assert s["etp"] * s["ep"] * s["edp"] == s["tp"] * s["cp"] * s["dp"]
    for axes in (None, ("etp", "ep", "edp", "pp")):
        np.testing.assert_array_equal(mesh.rank_of(mesh.coords(ranks, axes), axes), ranks)
    for axes in (("tp",), ("cp",), ("dp",), ("pp",), ("dp", "cp"), ("tp", "pp"), ("ep",),
                 ("etp",), ("edp",), ("etp", "ep"), ("tp", "cp", "dp", "pp")):
        g = mesh.groups(axes)
        assert g.shape[1] == math.prod(s[a] for a in axes)
        assert g.shape[0] * g.shape[1] == mesh.world_size
        np.testing.assert_array_equal(np.sort(g, axis=None), ranks)  # a partition
        # members agree on every other axis of their layout and differ along `axes`
        layout = ("etp", "ep", "edp", "pp") if set(axes) & {"etp", "ep", "edp"} else \
            ("tp", "cp", "dp", "pp")
        others = [a for a in layout if a not in axes]
        c = mesh.coords(g, others)
        assert (c == c[:, :1]).all()
    # expert layers live on the dense layers' pipeline stages (Megatron asserts equal pp groups)
    np.testing.assert_array_equal(mesh.coords(ranks, ("etp", "ep", "edp", "pp"))[:, 3],
                                  mesh.coords(ranks, ("pp",))[:, 0])
    if s["etp"] == s["tp"] and mesh.order[0] == "tp":
        # tp innermost in both layouts, so etp coordinate = tp coordinate: the expert
        # gradient group lies inside the dense gradient group (dp × cp)
        dp_cp = mesh.groups(("dp", "cp"))
        row = np.empty(mesh.world_size, dtype=np.int64)
        row[dp_cp] = np.arange(len(dp_cp))[:, None]
        edp = mesh.groups("edp")
        assert (row[edp] == row[edp][:, :1]).all()


def test_docs_16_rank_example():
    # docs/mesh.md: tp=2 dp=4 pp=2 ep=2 (etp=2, edp=2); dense rank = t + 2d + 8s,
    # expert rank = t + 2e + 4d' + 8s; ep varies e, edp varies d'.
    mesh = DeviceMesh.from_megatron(2, 2, 4, expert_model_parallel_size=2)
    assert mesh.world_size == 16 and mesh.size("edp") == 2
    assert mesh.coords(6).tolist() == [0, 0, 3, 0]
    assert mesh.coords(6, ("etp", "ep", "edp")).tolist() == [0, 1, 1]
    assert mesh.groups("ep").tolist() == [[t + 4 * d + 8 * s, t + 2 + 4 * d + 8 * s]
                                          for s in (0, 1) for d in (0, 1) for t in (0, 1)]
    assert mesh.groups("edp").tolist() == [[t + 2 * e + 8 * s, t + 2 * e + 4 + 8 * s]
                                           for s in (0, 1) for e in (0, 1) for t in (0, 1)]
    # etp = 1, ep = 4: rank = e + 4d' + 8s
    mesh = DeviceMesh.from_megatron(2, 2, 4, expert_model_parallel_size=4,
                                    expert_tensor_parallel_size=1)
    assert mesh.groups("ep").tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11],
                                          [12, 13, 14, 15]]
    assert mesh.groups("edp").tolist() == [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13],
                                           [10, 14], [11, 15]]
