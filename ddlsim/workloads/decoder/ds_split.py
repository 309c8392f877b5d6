"""DeepSpeed's split of a decoder's transformer layers over its pipeline stages, the default
split of the ``deepspeed`` stack (``system.software.kernels.pipeline_split: deepspeed``:
:func:`.split.chunk_layers`).

Megatron-DeepSpeed 4efb479d ``megatron/model/gpt_model.py`` (``GPTModelPipe.__init__``, lines
338-466) lists the pipeline's layers as specs: the fp16/bf16 cast, the embedding, one
``ParallelTransformerLayerPipe`` per layer, the MoE loss (MoE models), the final norm, the
output layer and the cast back; it hands them to DeepSpeed's ``PipelineModule`` with
``partition_method='type:transformer'``. DeepSpeed 38327e07 ``deepspeed/runtime/pipe/
module.py`` ``_partition_layers`` (lines 409-414) weighs each spec 1 where its class name
matches ``transformer`` (``_find_layer_type``, lines 319-338: only the transformer layers) and
0 elsewhere, and splits the list with ``deepspeed/runtime/utils.py`` ``partition_balanced``
(lines 583-620, since DeepSpeed #4312 of 2023-12): a dynamic programme over contiguous parts
that minimises the largest part's weight less the smallest's, a later boundary winning a tie.

With ``L ≥ S`` layers over ``S`` stages that programme gives the first ``L mod S`` stages
``L // S + 1`` layers and the others ``L // S`` (``tests/test_ds_split.py`` runs the
programme, written apart, for ``L`` up to 200 and ``S`` up to 64, with the specs before and
after the layers as Megatron-DeepSpeed lists them); where ``L < S`` it leaves stages without
a transformer layer, which ddlsim refuses. Where the layers divide, the split is the even one.
"""

from __future__ import annotations

__all__ = ["split_deepspeed"]


def split_deepspeed(layers: int, stages: int) -> list[int]:
    """Transformer layers of each of ``stages`` pipeline stages as DeepSpeed's
    ``type:transformer`` partition balances them (module docstring).

    Raises
    ------
    ValueError
        if a stage would hold no transformer layer (fewer layers than stages).
    """
    if layers < stages:
        raise ValueError(f"{layers} transformer layers over {stages} pipeline stages: "
                         "DeepSpeed's balanced partition leaves a stage without a transformer "
                         "layer, which ddlsim does not model")
    q, r = divmod(layers, stages)
    return [q + 1] * r + [q] * (stages - r)
