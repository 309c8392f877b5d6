"""The search tier: every plan of a grid evaluated as arrays, the best re-checked exactly.

``ddlsim.search`` is this subpackage *and* the search function: the module is callable, so

    >>> import ddlsim
    >>> frame = ddlsim.search("examples/search-gpt3-175b-1024.yaml", top=5)   # a DataFrame
    >>> from ddlsim.search import evaluate_grid, pareto_mask                 # the parts

both work (:func:`ddlsim.search.run.search` documents the arguments). The parts:
:mod:`.plans` (plans as arrays, the config rules vectorised), :mod:`.family` (what a workload
family supplies, and its registry), :mod:`.decoder` and :mod:`.decoder_dp` (the GPT/Llama family),
:mod:`.netcost` (the meshes' networks and point-to-point hops), :mod:`.collforms`
(collectives from the registered closed forms and NCCL's model),
:mod:`.pipeline` (the pipeline, overlap and update closed forms), :mod:`.evaluate` (grid →
ranked frame), :mod:`.spec` (the ``search:`` section), :mod:`.run` (:func:`search`).
"""

from __future__ import annotations

import sys
import types

from .evaluate import Grid, evaluate_grid, evaluate_plans, pareto_mask, rank
from .family import StageCosts, VectorFamily, register_vector_family, vector_family
from .plans import PlanSet, enumerate_plans
from .run import load_search, search
from .spec import OBJECTIVES, SearchSpec, parse_search_section

__all__ = ["search", "load_search", "evaluate_grid", "evaluate_plans", "Grid", "pareto_mask",
           "rank", "StageCosts", "VectorFamily", "register_vector_family", "vector_family",
           "PlanSet", "enumerate_plans", "OBJECTIVES", "SearchSpec", "parse_search_section"]


class _CallableModule(types.ModuleType):
    """This module, callable: ``ddlsim.search(...)`` is :func:`ddlsim.search.run.search`."""

    def __call__(self, *args, **kwargs):
        return search(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
