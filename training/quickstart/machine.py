"""What machine a quickstart run ran on: CPU, the kernels' instruction set, the packages, the load
(summary.json `machine`), so a run's numbers can be read against the machine that made them."""
from __future__ import annotations

import os

# The environment variables that pick the CPU kernels' instruction set (torch's ATen dispatch,
# oneDNN, MKL): ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 runs
# the AVX2 kernels on an AVX-512 CPU (the same CPU, other kernels: not a second CPU family).
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def machine_load() -> dict:
    """CPU seconds used (this process and its children, e.g. the sandbox) and the load average:
    on a shared machine wall time alone says little about what the run itself needs."""
    import resource

    import torch

    used = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))
    return {"cpu_seconds": round(used, 1), "cpus": os.cpu_count(), "load_average_1min": round(os.getloadavg()[0], 1),
            "cpu_model": _cpu_model(), "cpu_flags": cpu_flags(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "kernel_env": {k: os.environ.get(k) for k in KERNEL_ENV}, "packages": installed_packages()}


def _cpu_model() -> str:
    """/proc/cpuinfo's model name (platform.processor() elsewhere): with `cpu_capability`, the
    instruction set torch's kernels use (AVX2, AVX512, ...), which moves the run as packages do
    (docs/history.md, "the CPU moves the run too")."""
    import platform
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# the instruction-set flags that pick oneDNN's and MKL's kernels beyond ATen's AVX2 / AVX512: a
# virtualised "Intel(R) Xeon(R) Processor" names no generation, and two of them gave one seed
# different expert replies (docs/history.md, issue 43 round 5)
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """The `KERNEL_FLAGS` the CPU has (the first processor's `flags` line; [] where unreadable)."""
    try:
        with open(cpuinfo, encoding="utf-8") as info:
            flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    except OSError:
        return []
    return [f for f in KERNEL_FLAGS if f in flags]


def installed_packages() -> dict[str, str]:
    """Every installed distribution and its version (what `pip freeze` lists): the quickstart's
    numbers move with torch and transformers (docs/history.md, "Measured on today's packages")."""
    from importlib.metadata import distributions

    return dict(sorted((d.metadata["Name"], d.version) for d in distributions() if d.metadata["Name"]))
