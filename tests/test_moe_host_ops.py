"""benchmarks/moe_host_ops.py: the host operations measured by running Megatron-Core's MoE layer
on CPU (benchmarks/data/moe_host_ops/), and the router calls ddlsim charges from them
(decoder/moe_router.py ``router_host_calls``, docs/moe.md "Host operations, measured")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from benchscripts import load_script

import ddlsim
from ddlsim.workloads.decoder.moe_host import DISPATCHER_HOST, dispatcher_host
from ddlsim.workloads.decoder.moe_router import UNFUSED_HOST_CALLS
from ddlsim.workloads.decoder.moeplan import resolve_moe

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

ops = load_script("moe_host_ops")


def _plan(router_fusion: bool, aux_loss_coeff: float = 1e-3):
    cfg = {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 2},
           "parallel": {"expert_model_parallel_size": 8, "expert_tensor_parallel_size": 1,
                        "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                                "permute_fusion": True, "router_force_load_balancing": True,
                                "router_fusion": router_fusion,
                                "aux_loss_coeff": aux_loss_coeff}},
           "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096,
                     "dtype": "bf16"},
           "system": {"preset": "dgx-h100", "nodes": 1,
                      "software": {"stack": "megatron-core-2025"}}}
    return resolve_moe(ddlsim.load_config(cfg))


@pytest.mark.parametrize("coeff, extra", [(1e-3, 9 + 8), (0.0, 9)])
def test_the_unfused_router_adds_its_fallbacks_calls(coeff, extra):
    # the fused count (DISPATCHER_HOST's router 16) with TE's fused router; its torch
    # fallbacks make 10 calls for top-k where the fused path makes 1, and 10 for the aux loss
    # where it makes 2
    fused = dispatcher_host(_plan(True, coeff))
    unfused = dispatcher_host(_plan(False, coeff))
    assert fused.work_ops == DISPATCHER_HOST["alltoall"].work_ops
    assert unfused.work_ops - fused.work_ops == extra


def _calls(where: dict, file: str, first: int, last: int) -> int:
    pattern = re.compile(rf"^{re.escape(file)}:(\d+) ")
    return sum(n for k, n in where.items()
               if (m := pattern.match(k)) and first <= int(m.group(1)) <= last)


@pytest.mark.parametrize("local", [4, 16])
def test_the_fallbacks_calls_are_the_measured_ones(local):
    # Megatron-LM d7288711 moe_utils.py: top-k with its score function lines 723-821; the aux
    # loss's routing scores 857-866 and the switch loss 142-143
    data = json.loads((ops.DATA / f"d7288711_{local}.json").read_text())
    where = data["fwd"]["where"]["router"]
    assert _calls(where, "moe_utils.py", 723, 821) - 1 == UNFUSED_HOST_CALLS["topk"]
    assert _calls(where, "moe_utils.py", 857, 866) + _calls(where, "moe_utils.py", 142, 143) \
        - 2 == UNFUSED_HOST_CALLS["aux_loss"]


@pytest.mark.parametrize("name", ["1e057005_4", "1e057005_16", "d7288711_4", "d7288711_16"])
def test_every_count_carries_its_provenance(name):
    data = json.loads((ops.DATA / f"{name}.json").read_text())
    prov = data["provenance"]
    assert prov["megatron_commit"].startswith(name.split("_")[0])
    assert prov["local_experts"] == int(name.split("_")[1]) and prov["torch"] and prov["patched"]
    assert set(ops.measured(data)) >= set(ops.PARTS)


def test_the_table_sets_each_part_beside_ddlsim():
    rows = {r[2]: r for r in ops.table("1e057005", 16)}
    assert list(rows) == list(ops.PARTS)
    header = ops.HEADER.index("ddlsim host ops")
    # the ModelZoo rows' unfused router: the fused 16 and the fallbacks' 17
    assert rows["router"][header] == 16 + 17
    assert rows["router"][ops.HEADER.index("fwd calls")] == 31
    # ddlsim's TE grouped linears' backward: measured seconds per local expert and linear
    # (moe_host_chain.GROUPED_LINEAR_BWD_S, benchmarks/te_grouped_host.py), no counted ops
    assert rows["experts"][ops.HEADER.index("ddlsim bwd host")] == 0


def test_counting_refuses_a_folder_that_is_not_megatron(tmp_path: Path):
    with pytest.raises(SystemExit, match="moe_host_ops"):
        ops.count(tmp_path, "d7288711", 4)


def test_host_seconds_take_out_the_transport_the_hooks_and_the_kernels():
    # x(T) = thread µs - c10d µs - hooked nodes x (hooked - bare backward) / nodes; the
    # kernels' share at T (x(8T) - x(T)) / 7, the glue x(T) less it
    def run(scale: float) -> dict:
        return {"us": {"router": 100 + 10 * scale, "dispatch.all_to_all": 300.0,
                       "bwd.router": 90 + 7 * scale, "experts": 5000.0},
                "c10d_us": {"dispatch.all_to_all": 280.0},
                "bwd_total_us": {"hooks": 150.0, "bare": 100.0},
                "bwd_nodes": {"bwd.router": 4, "bwd.experts": 6}}
    secs = ops.host_seconds({"timing": {"16": run(1), "128": run(8)}})
    assert secs["fwd.router"] == {"host_s": pytest.approx(100e-6),
                                  "kernels_s": pytest.approx(10e-6)}
    assert secs["fwd.dispatch"]["host_s"] == pytest.approx(20e-6)
    assert secs["bwd.router"]["host_s"] == pytest.approx((97 - 4 * 5 - 7) * 1e-6)
    assert "fwd.experts" not in secs     # SequentialMLP is not what the rows ran


def test_the_package_data_file_is_the_committed_timings_with_provenance():
    import yaml
    shipped = yaml.safe_load(ops.PACKAGE_DATA.read_text())
    assert shipped == ops.data_file()      # --write-data's, unedited
    for commit, code in shipped["code"].items():
        assert code["megatron"].startswith("NVIDIA/Megatron-LM " + commit)
        assert set(code["local_experts"]) == {4, 16}
        for run in code["local_experts"].values():
            prov = run["provenance"]
            assert prov["megatron_commit"].startswith(commit) and len(prov["megatron_commit"]) == 40
            assert prov["passes"] >= 20 and prov["tokens"] == list(ops.TOKENS)
            assert all(prov[k] for k in ("torch", "cpu", "date", "patched", "command", "ranks"))
            assert set(run["host_s"]["fwd"]) == set(run["calls"]) == {"router", "dispatch",
                                                                       "combine"}
    header = ops.PACKAGE_DATA.read_text().split("\ncode:")[0]
    assert "Xeon Platinum 8480C" in header and "ratio 1" in header


def test_an_exported_tree_names_its_commit_in_a_stamp(tmp_path):
    """A tree exported without git (as carried to a lent GPU) is read by its MEGATRON_COMMIT
    file; another commit is refused with both named."""
    full = "d7288711ba278d160d2a5a22c099915c9fe1395c"
    (tmp_path / "MEGATRON_COMMIT").write_text(full + "\n")
    assert ops.checkout_commit(tmp_path, "d7288711") == full
    with pytest.raises(SystemExit, match="d7288711.*not 1e057005"):
        ops.checkout_commit(tmp_path, "1e057005")
