"""The machine as NCCL's tuning model sees it (:class:`~.model.NcclEnv`), read from a system
config: the GPU generation, the link class inside a node, NVSwitches, CPU vendor, SHARP."""

from __future__ import annotations

from .model import NcclEnv

__all__ = ["gpu_arch", "env_for_system"]


#: device-name fragments → NCCL's compute-capability class (NVIDIA datasheets: V100 sm70,
#: A100/A800 sm80, H100/H200/H800/GH200 sm90, B200/GB200 sm100)
_ARCH_OF_NAME = (("gb200", "blackwell"), ("b200", "blackwell"), ("h100", "hopper"),
                 ("h200", "hopper"), ("h800", "hopper"), ("gh200", "hopper"),
                 ("a100", "ampere"), ("a800", "ampere"), ("v100", "volta"))


def gpu_arch(system) -> str | None:
    """``system.collectives.gpu_arch``, or the class named by the device's name, or None."""
    spec = system.collectives
    if spec.gpu_arch != "auto":
        return spec.gpu_arch
    name = system.device.name.lower()
    return next((arch for frag, arch in _ARCH_OF_NAME if frag in name), None)


def env_for_system(system) -> NcclEnv | None:
    """The :class:`NcclEnv` of ``system``, or None where its GPU generation is unknown.

    Raises
    ------
    ConfigError
        Where ``system.collectives.nccl_version`` has no tuning rows for the GPU generation.
    """
    arch = gpu_arch(system)
    if arch is None:
        return None
    kind = system.intra_node.kind
    spec = system.collectives
    return NcclEnv(arch, "nvlink" if kind.startswith("nv") else "pci", kind == "nvswitch",
                   spec.cpu_vendor, spec.sharp, spec.nccl_protocol, system.nics_per_node,
                   spec.nccl_version)
