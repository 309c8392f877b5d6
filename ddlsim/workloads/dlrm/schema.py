"""The ``dlrm`` model section: embedding tables, MLPs, interaction, sharding, proxy timings.

Field names follow TorchRec's DLRM (``torchrec.models.dlrm``, the MLPerf reference
``dlrm_main.py``): ``dense_features`` is ``dense_in_features``, ``bottom_mlp`` is
``dense_arch_layer_sizes`` (output widths, the input is ``dense_features``), ``top_mlp`` is
``over_arch_layer_sizes`` (output widths, the input is the interaction's output),
``cross_layers`` / ``low_rank`` are ``dcn_num_layers`` / ``dcn_low_rank_dim``. In
facebookresearch/dlrm's ``dlrm_s_pytorch.py`` terms, ``--arch-mlp-bot=128-128-128-128`` is
``dense_features: 128, bottom_mlp: [128, 128, 128]`` and ``--arch-mlp-top`` is ``top_mlp``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StrictBool, field_validator, model_validator

from ... import units
from ...config import ModelBase, _Strict, count_type, reject_bool
from ...errors import did_you_mean

__all__ = ["EmbeddingTable", "DLRMModel", "PROXY_PARTS", "SHARDINGS", "INTERACTIONS",
           "EMBEDDING_OPTIMIZERS"]

#: How embedding tables are spread over the ranks.
SHARDINGS = ("table_wise", "row_wise", "column_wise")
#: Feature interactions: pairwise dot products (DLRM), a DCN-v2 cross network, concatenation.
INTERACTIONS = ("dot", "dcnv2", "cat")
#: Optimizers of the embedding tables and the fp32 state bytes each keeps per row element
#: (sgd: none; adagrad: one accumulator per element, FBGEMM EXACT_ADAGRAD; rowwise_adagrad:
#: one per row, FBGEMM EXACT_ROWWISE_ADAGRAD).
EMBEDDING_OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")
#: The compute parts of one iteration, the keys of ``proxy_timings``.
PROXY_PARTS = ("embedding_forward", "bottom_mlp_forward", "interaction_forward",
               "top_mlp_forward", "top_mlp_backward", "interaction_backward",
               "bottom_mlp_backward", "embedding_backward", "optimizer")

_Rows = Annotated[int, BeforeValidator(reject_bool), Field(ge=1, le=10**12)]
_Pooling = Annotated[float, BeforeValidator(reject_bool), Field(gt=0, le=10**6)]


class EmbeddingTable(_Strict):
    """One embedding table: ``rows`` × ``dim``, ``pooling`` indices looked up (and summed)
    per sample on average."""

    rows: _Rows
    dim: count_type("hidden_size") | None = Field(default=None,
                                                  description="default model.embedding_dim")
    pooling: _Pooling = Field(default=1.0, description="mean indices per sample (multi-hot size)")
    name: str | None = None


def _table(v: Any) -> Any:
    """A bare number of rows is a table with the default dimension and pooling 1."""
    return {"rows": v} if isinstance(v, int) and not isinstance(v, bool) else v


def _seconds(name: str, v: Any) -> float:
    try:
        s = units.parse_quantity(v, "time")
    except units.UnitError as exc:
        raise ValueError(f"model.proxy_timings.{name}: {exc}") from None
    if not 0 <= s <= 3600:
        raise ValueError(f"model.proxy_timings.{name} = {v!r} must lie between 0 s and 1 h "
                         "(a proxy's usleep of one layer; write units, e.g. '341 us')")
    return s


class DLRMModel(ModelBase):
    """A DLRM (Naumov et al. 2019, arXiv:1906.00091) or DLRM-DCNv2 (Wang et al. 2021)."""

    architecture: Literal["dlrm"] = "dlrm"
    tables: list[Annotated[EmbeddingTable, BeforeValidator(_table)]] = Field(min_length=1)
    embedding_dim: count_type("hidden_size")
    dense_features: count_type("hidden_size")
    bottom_mlp: list[count_type("hidden_size")] = Field(min_length=1)
    top_mlp: list[count_type("hidden_size")] = Field(min_length=1)
    interaction: Literal[INTERACTIONS] = "dot"
    interaction_self: StrictBool = Field(
        default=False, description="dot: include each feature's product with itself "
                                   "(dlrm_s_pytorch --arch-interaction-itself)")
    cross_layers: count_type("layers") | None = Field(default=None, description="dcnv2 only")
    low_rank: count_type("hidden_size") | None = Field(
        default=None, description="dcnv2: rank of the low-rank cross layers; null: full rank")
    sharding: Literal[SHARDINGS] = "table_wise"
    embedding_optimizer: Literal[EMBEDDING_OPTIMIZERS] = "sgd"
    overlap_embedding_all_to_all: StrictBool = Field(
        default=True, description="the bottom MLP runs while the pooled embeddings travel "
                                  "(dlrm_s_pytorch's async all-to-all); false: blocking")
    compute: Literal["model", "proxy"] = "model"
    proxy_timings: dict[str, Any] | None = None

    @field_validator("proxy_timings")
    @classmethod
    def _timings(cls, v: dict[str, Any] | None) -> dict[str, float] | None:
        if v is None:
            return None
        bad = [k for k in v if k not in PROXY_PARTS]
        if bad:
            raise ValueError(f"model.proxy_timings has unknown part {bad[0]!r}"
                             f"{did_you_mean(bad[0], PROXY_PARTS)}; the parts are "
                             f"{', '.join(PROXY_PARTS)}")
        return {k: _seconds(k, s) for k, s in v.items()}

    @model_validator(mode="after")
    def _check(self) -> "DLRMModel":
        self._check_proxy()
        if self.interaction == "dcnv2":
            if self.cross_layers is None:
                raise ValueError("model.interaction = 'dcnv2' needs model.cross_layers (the "
                                 "number of cross layers, TorchRec's dcn_num_layers; MLPerf: 3)")
        elif self.cross_layers is not None or self.low_rank is not None:
            raise ValueError(f"model.cross_layers / model.low_rank describe a DCN-v2 cross "
                             f"network, but model.interaction = {self.interaction!r}; set "
                             "interaction: dcnv2 or remove them")
        if self.interaction_self and self.interaction != "dot":
            raise ValueError("model.interaction_self = true applies to interaction: dot only")
        d = self.bottom_mlp[-1]
        dims = sorted({t.dim or self.embedding_dim for t in self.tables})
        if self.interaction == "dot" and dims != [d]:
            raise ValueError(f"model.interaction = 'dot' takes dot products between the bottom "
                             f"MLP's output ({d} wide, the last of model.bottom_mlp) and every "
                             f"pooled embedding, so every table's dim must be {d}; got dims "
                             f"{dims}")
        if self.interaction == "cat" and dims != [d]:
            raise ValueError(f"model.interaction = 'cat' stacks the bottom MLP's output ({d} "
                             f"wide) with every pooled embedding, so every table's dim must be "
                             f"{d}; got dims {dims}")
        return self

    def _check_proxy(self) -> None:
        if self.compute == "model":
            if self.proxy_timings is not None:
                raise ValueError("model.proxy_timings is given but model.compute = 'model' "
                                 "(the cost model times compute); set compute: proxy to use "
                                 "the timings, or remove them")
            return
        missing = [k for k in PROXY_PARTS if k not in (self.proxy_timings or {})]
        if missing:
            raise ValueError(f"model.compute = 'proxy' needs a duration for every compute part "
                             f"in model.proxy_timings; missing: {', '.join(missing)} (write "
                             "the proxy's usleep, e.g. '341 us', or '0 s' for a part the proxy "
                             "does not time)")

    def dim_of(self, table: EmbeddingTable) -> int:
        """The dimension of ``table`` (its own, or ``embedding_dim``)."""
        return table.dim or self.embedding_dim

