"""The reference trainer's element-wise kernel classes as microbenchmarks on this machine.

ddlsim times an element-wise kernel as the bytes its recipe counts over a bandwidth, and a
kernel of a class (``simulator/kernels/elementwise.py``, ``ELEMENTWISE_CLASSES``) at its
class's own, ``device.elementwise_efficiency[class]`` times the device's streaming bandwidth.
On GPUs those fractions come from published kernel tables; here they come from timing the
numpy functions the reference model runs for each class, alone, on the run's own tensor
sizes (so each sees the caches its tensors see in the run), against the bytes ddlsim's
recipe counts for them:

==========================  ==================================  =========================
class                       numpy function (:mod:`.gpt2`)       bytes ddlsim counts
==========================  ==================================  =========================
``norm``                    ``_layernorm`` on ``T × h``          unfused LayerNorm, 20 B
``norm_backward``           ``_layernorm_back`` on ``T × h``     twice the forward, 40 B
``activation``              ``_gelu`` on ``T × 4h``              the GeLU kernel, 8 B
``activation_backward``     ``_gelu_back`` on ``T × 4h``         twice it, 16 B
``optimizer``               ``Adam.step`` on the flat buffer     fused Adam with the
                                                                 gradient norm, 32 B/param
``softmax``                 ``_softmax`` on the scores ``S``     the unfused softmax in
                                                                 fp32, 24 B
``softmax_backward``        ``_softmax_back`` on ``S``           its backward, 28 B
==========================  ==================================  =========================

(per element in fp32, ``T = batch · seq``, ``S = batch · heads · seq²``; the counts are
ddlsim's own :func:`~ddlsim.simulator.kernels.elementwise.norm_passes`,
``activation_passes``, ``optimizer_bytes_per_param`` and ``unfused_softmax_passes`` with the
numpy stack's ``softmax_in_fp32`` (:data:`~.machine.NUMPY_STACK`), so the fraction is of
exactly what the cost model charges).
Why: numpy runs more passes than the kernels ddlsim counts (its GeLU is 8 calls over
``T × 4h``, its LayerNorm 6, its blocked Adam 12 passes per cache block, in cache, its
softmax 7 over the scores where ddlsim counts 3: scale, mask, row maximum, subtract, exp,
row sum, divide), and tanh and exp are compute-bound in numpy, so these kernels do not run
at the rate of ``z = x + y``
(docs/validation.md, "Op by op"). Each class's rate is measured, not fitted to the loop.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

__all__ = ["CLASS_KERNELS", "class_kernels", "class_rates", "efficiencies", "system_rates"]

#: the classes :func:`class_kernels` measures, in the order it runs them
CLASS_KERNELS = ("norm", "norm_backward", "activation", "activation_backward", "optimizer",
                 "softmax", "softmax_backward")


def _counted_bytes(shape) -> dict[str, float]:
    """Bytes ddlsim's recipes count for one call of each class's kernel(s) on ``shape``'s
    tensors (module docstring), fp32."""
    from ..simulator.kernels.elementwise import (activation_passes, norm_passes,
                                                 optimizer_bytes_per_param,
                                                 unfused_softmax_passes)
    from .machine import NUMPY_STACK
    x = shape.batch * shape.seq * shape.hidden
    norm = sum(norm_passes(False, "layernorm", 4, shape.hidden)) * x
    gelu = activation_passes(False, True, False, 4)[-1] * 4 * x      # the GeLU kernel alone
    step = optimizer_bytes_per_param("adam", True, 4, 4, False) * shape.padded
    fp32 = NUMPY_STACK["kernels"]["softmax_in_fp32"]
    scores = shape.batch * shape.heads * shape.seq ** 2
    return {"norm": norm, "norm_backward": 2 * norm, "activation": gelu,
            "activation_backward": 2 * gelu, "optimizer": step,
            **{name: sum(unfused_softmax_passes(4, fp32, backward)) * scores
               for name, backward in (("softmax", False), ("softmax_backward", True))}}


def class_kernels(shape, seed: int = 0) -> dict[str, tuple[Callable[[], object], float]]:
    """Each class's kernel as a call on its own arrays, and the bytes ddlsim counts for it.

    Parameters
    ----------
    shape : GPTShape
        The reference model and micro-batch (:class:`~.gpt2.GPTShape`).
    seed : int
        Seed of the arrays' values.

    Returns
    -------
    dict
        Class name (:data:`CLASS_KERNELS`) → (a call running the class's numpy kernel once,
        bytes ddlsim counts for that call).
    """
    from .gpt2 import Adam
    from .gpt2_layers import gelu, gelu_back, layernorm, layernorm_back, softmax, softmax_back
    rng = np.random.default_rng(seed)
    t, h = shape.batch * shape.seq, shape.hidden
    x = rng.standard_normal((t, h), dtype=np.float32)
    w, b = np.ones(h, np.float32), np.zeros(h, np.float32)
    dw, db = np.zeros(h, np.float32), np.zeros(h, np.float32)
    _, cache = layernorm(x, w, b)
    y = rng.standard_normal((t, 4 * h), dtype=np.float32)
    _, tanh = gelu(y)
    p = np.zeros(shape.padded, np.float32)
    g = rng.standard_normal(shape.padded, dtype=np.float32) * np.float32(1e-3)
    adam = Adam(shape.padded)
    att, datt, mask, scale = _scores(shape, rng)
    calls = {"norm": lambda: layernorm(x, w, b),
             "norm_backward": lambda: layernorm_back(x, w, cache, dw, db),
             "activation": lambda: gelu(y),
             "activation_backward": lambda: gelu_back(y, y, tanh),
             "optimizer": lambda: adam.step(p, g),
             "softmax": lambda: softmax(att, mask, scale),
             "softmax_backward": lambda: softmax_back(datt, att, scale)}
    counted = _counted_bytes(shape)
    return {name: (calls[name], counted[name]) for name in CLASS_KERNELS}


def _scores(shape, rng):
    """The attention core's scores ``q·kᵀ`` (``[batch, heads, seq, seq]``) of random q and k,
    their gradient, the causal mask and the scale, as :class:`~.gpt2.GPT2` makes them."""
    from .gpt2 import GPT2
    d = shape.hidden // shape.heads
    q, k = rng.standard_normal((2, shape.batch, shape.heads, shape.seq, d), dtype=np.float32)
    att = q @ k.transpose(0, 1, 3, 2)
    datt = rng.standard_normal(att.shape, dtype=np.float32)
    return att, datt, GPT2.causal_mask(shape.seq), np.float32(1.0 / np.sqrt(d))


def class_rates(kernels: dict, reps: dict[str, int] | None = None) -> dict[str, float]:
    """Bytes/s of each class's kernel: the bytes ddlsim counts over the least process CPU
    time of ``reps[name]`` calls (3 unless given; the optimizer's step, tens of ms, once).

    Parameters
    ----------
    kernels : dict
        :func:`class_kernels`' answer.
    reps : dict, optional
        Calls per class.

    Returns
    -------
    dict
        Class name → B/s (counted bytes / CPU seconds).
    """
    reps = {"optimizer": 1, **(reps or {})}
    out = {}
    for name, (call, counted) in kernels.items():
        best = np.inf
        for _ in range(reps.get(name, 3)):
            c = time.process_time()
            call()
            best = min(best, time.process_time() - c)
        out[name] = counted / max(best, 1e-9)
    return out


def efficiencies(rates: dict[str, float], stream_Bps: float) -> dict[str, float]:
    """``device.elementwise_efficiency`` of this machine: each class's rate over the
    streaming rate ``stream_Bps`` the system's ``memory_bandwidth_Bps`` is (numpy
    ``z = x + y`` on the gradient buffer, :mod:`.interleaved`), rounded to 4 digits.

    Parameters
    ----------
    rates : dict
        Class name → B/s (:func:`class_rates`, the statistic over the rounds).
    stream_Bps : float
        B/s of the streaming pass.

    Returns
    -------
    dict
        Class name → fraction of ``stream_Bps`` (above 1 where the class's tensors stay in
        cache and the streaming pass's do not).
    """
    if not stream_Bps > 0:
        raise ValueError(f"stream_Bps must be > 0, got {stream_Bps!r}")
    return {name: round(rate / stream_Bps, 4) for name, rate in rates.items()}


def system_rates(doc: dict, statistic: str, exchange_statistic: str) -> tuple[float, dict]:
    """The streaming bandwidth and ``elementwise_efficiency`` of an interleaved job
    (``interleaved{N}.json``), each rate taken with the statistic of the part of the
    iteration it is compared in (:func:`~.interleaved.measured_s`): the forward and
    backward's passes with ``statistic``, the optimizer step, timed in the exchange and
    update, with ``exchange_statistic``.

    Parameters
    ----------
    doc : dict
        The interleaved job's JSON.
    statistic, exchange_statistic : {"median", "min"}
        The loop's compute and exchange statistics.

    Returns
    -------
    (float, dict)
        B/s of ``z = x + y`` on the gradient buffer, and class → fraction of it.
    """
    from .interleaved import element_rates
    rates, step = element_rates(doc, statistic), element_rates(doc, exchange_statistic)
    classes = {name: rates[f"class.{name}"] for name in CLASS_KERNELS}
    classes["optimizer"] = step["class.optimizer"]
    return rates["gradients"], efficiencies(classes, rates["gradients"])
