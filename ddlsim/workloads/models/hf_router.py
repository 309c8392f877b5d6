"""A Hugging Face ``config.json``'s router settings, read as the defaults of ``parallel.moe``:
the load-balancing loss coefficient (:func:`router_aux_loss_coef`), DeepSeek's group-limited
routing (:func:`router_groups`) and its balancing (:func:`router_balancing`). The model's sizes
are :mod:`.hf`'s."""

from __future__ import annotations

from .hf import _DEEPSEEK_TYPES, _MOE_TYPES, _bool, _err, _int, _model_type

__all__ = ["router_aux_loss_coef", "router_groups", "router_balancing"]


def router_aux_loss_coef(doc: dict, source: str) -> float | None:
    """The load-balancing loss coefficient of an MoE ``config.json`` (``router_aux_loss_coef``:
    transformers' Mixtral, Qwen2/3-MoE and GPT-OSS models add it times the loss to the
    training loss), or None when the file has none, describes a dense model, or leaves
    ``output_router_logits`` false: those models compute the loss only under it
    (huggingface/transformers ``models/mixtral/modeling_mixtral.py``,
    ``MixtralForCausalLM.forward``: ``if output_router_logits: aux_loss =
    load_balancing_loss_func(...)``, then ``loss += self.router_aux_loss_coef * aux_loss``;
    the flag's default is the config's), so a published file with it false trains without one.

    Raises
    ------
    ConfigError
        When it is not a number >= 0.
    """
    value = doc.get("router_aux_loss_coef")
    if value is None or _model_type(doc, source) not in _MOE_TYPES:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise _err(source, "router_aux_loss_coef", value, "a number >= 0")
    return float(value) if doc.get("output_router_logits") is True else None


#: DeepSeek's router selection rules that limit each token to ``topk_group`` of ``n_group``
#: expert groups (transformers 4.56 ``modeling_deepseek_v2.py``
#: ``DeepseekV2Moe.route_tokens_to_experts``: ``group_limited_greedy``; ``modeling_deepseek_v3.py``
#: ``DeepseekV3MoE.route_tokens_to_experts``: always, the ``noaux_tc`` rule of V3's
#: ``modeling_deepseek.py``); ``greedy`` (DeepSeek-V2-Lite) picks over all experts
_GROUP_LIMITED = ("group_limited_greedy", "noaux_tc")


def router_groups(doc: dict, source: str) -> tuple[int, int] | None:
    """``(n_group, topk_group)`` of a DeepSeek ``config.json`` whose router limits each token
    to ``topk_group`` of ``n_group`` expert groups (``topk_method`` ``group_limited_greedy``,
    V2; ``noaux_tc``, V3), read as the default of ``parallel.moe.router_num_groups`` and
    ``router_group_topk``; None when it does not (no groups, one group, every group allowed,
    ``greedy``, or another model type).

    Raises
    ------
    ConfigError
        When ``n_group`` does not divide ``n_routed_experts``, or ``topk_group`` is not between
        1 and ``n_group`` or holds fewer experts than ``num_experts_per_tok``.
    """
    mt = _model_type(doc, source)
    if mt not in _DEEPSEEK_TYPES:
        return None
    # V3's router always limits the groups (its remote code has noaux_tc only)
    method = "noaux_tc" if mt == "deepseek_v3" else doc.get("topk_method", "greedy")
    groups = _int(doc, "n_group", source, required=False)
    allowed = _int(doc, "topk_group", source, required=False)
    if method not in _GROUP_LIMITED or groups in (None, 1) or allowed is None:
        return None
    experts = _int(doc, "n_routed_experts", source)
    top_k = _int(doc, "num_experts_per_tok", source)
    if experts % groups:
        raise _err(source, "n_group", groups, f"a divisor of n_routed_experts = {experts} "
                   "(each group holds as many consecutive experts)")
    if allowed > groups or allowed * (experts // groups) < top_k:
        raise _err(source, "topk_group", allowed, f"between 1 and n_group = {groups}, its "
                   f"groups holding at least num_experts_per_tok = {top_k} experts")
    return None if allowed == groups else (groups, allowed)


#: ``topk_method`` values of DeepSeek's remote code (DeepSeek-V2 ``modeling_deepseek.py``
#: ``MoEGate``: greedy, group_limited_greedy; DeepSeek-V3's: noaux_tc) and ``scoring_func``
#: values (V2: softmax; V3: sigmoid)
_TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")
_SCORING = ("softmax", "sigmoid")


def router_balancing(doc: dict, source: str) -> dict:
    """How a DeepSeek ``config.json``'s router balances, as model-section fields: the defaults
    of ``parallel.moe.router_score_function`` (``scoring_func``),
    ``router_enable_expert_bias`` (``topk_method: noaux_tc``: the ``e_score_correction_bias``
    of auxiliary-loss-free balancing), ``router_load_balancing_type`` (``seq_aux: true``:
    seq_aux_loss) and ``aux_loss_coeff`` (``aux_loss_alpha``, as ``router_aux_loss_coef``);
    empty for other model types.

    DeepSeek-V2's remote ``MoEGate`` computes the balance loss in training when
    ``aux_loss_alpha > 0``, per sequence under ``seq_aux``; V3's remote gate is inference
    code (``noaux_tc`` asserts ``not self.training``), so its training is the V3 report's:
    the expert bias with a sequence-wise loss of a small α (arXiv:2412.19437 §2.1.2; §4.2:
    α = 0.0001, the published config.json says 0.001), as Megatron-Bridge's
    ``DeepSeekV3ModelProvider`` runs it (seq_aux_loss, sigmoid, expert bias, rate 1e-3,
    coefficient 1e-4). The file's coefficient is read: at either value the loss's kernels
    are the same and the bias's statistic sets the load (:mod:`~ddlsim.workloads.decoder.
    moe_balance`). V3 always routes with ``noaux_tc`` (as :func:`router_groups`).

    Raises
    ------
    ConfigError
        A ``topk_method``, ``scoring_func``, ``seq_aux`` or ``aux_loss_alpha`` of the wrong
        kind or value, naming key, value and what is allowed.
    """
    mt = _model_type(doc, source)
    if mt not in _DEEPSEEK_TYPES:
        return {}
    method = "noaux_tc" if mt == "deepseek_v3" else doc.get("topk_method", "greedy")
    if method not in _TOPK_METHODS:
        raise _err(source, "topk_method", method, f"one of {', '.join(_TOPK_METHODS)}")
    scoring = doc.get("scoring_func", "softmax")
    if scoring not in _SCORING:
        raise _err(source, "scoring_func", scoring, f"one of {', '.join(_SCORING)}")
    alpha = doc.get("aux_loss_alpha", 0.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha >= 0:
        raise _err(source, "aux_loss_alpha", alpha, "a number >= 0")
    out = {"scoring_func": scoring, "topk_method": method}
    if alpha > 0:
        out.update(router_aux_loss_coef=float(alpha),
                   seq_aux=_bool(doc, "seq_aux", source, False))
    return out
