"""The search tier's memory follows ``software.compile`` as the exact engine's does: a compiled
loss keeps fewer bytes per logit and the pipeline's held logits count it (both read
``sw.compile`` in decoder/memory.py). Before 2026-11-29 the search tier ignored it: +1,753.5 MiB
per device on a compiled torchtitan-2025 plan of PP 2-4 (found in review)."""
import pytest
from searchmemory import assert_search_memory_is_exact, pp4_config

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def test_the_search_tiers_memory_follows_a_compiled_loss(monkeypatch):
    cfg = pp4_config("megatron-core-2024")
    # Megatron-LM 900f1b76 cannot compile the model (rule no_torch_compile): a what-if
    cfg["system"]["software"].update(compile=True, what_if=True)
    assert_search_memory_is_exact(monkeypatch, cfg, pipeline_holds_outputs=True,
                                  logit_bytes_compiled=2 + 2)
