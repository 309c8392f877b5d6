"""torchtitan's own split of a decoder's transformer layers over its virtual pipeline stages,
the default split of a torchtitan stack (``system.software.kernels.pipeline_split``:
:func:`.split.chunk_layers`) and what ``ddlsim import`` writes for a torchtitan config
(``ddlsim/importers/torchtitan_split.py``, which reads the run's own split options).

* **2024** (torchtitan 9dec370 ``torchtitan/parallelisms/pipelining_utils.py``
  ``generate_split_points``, lines 18-57): with ``L`` layers over ``S`` stages, the first
  stage gets ``L // S``, each middle stage ``L // S + 1`` while the remainder ``L mod S``
  lasts, then ``L // S``, and the last stage what is left.
* **2025** (torchtitan 07c00d9 ``torchtitan/distributed/pipeline_parallel.py``
  ``generate_llm_fqn_per_model_part``, lines 127-226): the embedding counts as
  ``pipeline_parallel_first_stage_less_layers`` layers and the norm and output as
  ``pipeline_parallel_last_stage_less_layers`` (1 each by default); the ``L + first + last``
  effective layers split evenly over the ``S`` stages, the first ``(L + first + last) mod S``
  stages one more, and the first (last) stage gives up ``first`` (``last``) of its share.

Llama 3.1 405B's 126 layers over 16 virtual stages are ``7, 8, …, 8, 7`` by both.
"""

from __future__ import annotations

__all__ = ["split_2024", "split_2025"]


def split_2024(layers: int, stages: int) -> list[int]:
    """Transformer layers of each of ``stages`` virtual stages, torchtitan 9dec370's split
    (module docstring).

    Parameters
    ----------
    layers, stages : int
        The model's transformer layers and the virtual stages.

    Returns
    -------
    list of int
        Layers per virtual stage, in stage order.

    Raises
    ------
    ValueError
        If there are more stages than layers (torchtitan raises it too).
    """
    if stages > layers:
        raise ValueError(f"{stages} pipeline stages for {layers} layers: torchtitan needs at "
                         "least one layer per stage")
    base, extra = divmod(layers, stages)
    out = [base]
    for _ in range(1, stages - 1):
        out.append(base + 1 if extra > 0 else base)
        extra -= 1 if extra > 0 else 0
    return out + [layers - sum(out)] if stages > 1 else [layers]


def split_2025(layers: int, stages: int, first: int = 1, last: int = 1) -> list[int]:
    """Transformer layers of each of ``stages`` virtual stages (as :func:`split_2024`'s),
    torchtitan 07c00d9's split with the embedding weighing ``first`` layers and the output
    ``last`` (``pipeline_parallel_first/last_stage_less_layers``; module docstring);
    ValueError where torchtitan raises (empty stages, a weight above a stage's share)."""
    if stages == 1:
        return [layers]
    effective = layers + first + last
    base, extra = divmod(effective, stages)
    if base == 0 or first > base or last > base:
        raise ValueError(f"{layers} layers (+{first} for the embedding, +{last} for the "
                         f"output) over {stages} pipeline stages leave {base} per stage: "
                         "torchtitan refuses it")
    out, left = [], layers
    for k in range(stages):
        share = base + (1 if k < extra else 0)
        share -= first if k == 0 else last if k == stages - 1 else 0
        out.append(min(share, left))
        left -= out[-1]
    return out
