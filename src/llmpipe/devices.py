"""Dense BF16 peak TFLOP/s per device: the one table MFU is measured against (the trainers' metrics,
benchmarks/gpu_cases.py); hardware.yaml's peak_tflops agree with it (tests/test_devices.py).

A device is what one rank drives: a GPU, a NeuronCore (Trainium, as hardware.yaml counts them), a TPU
chip. A name, as torch.cuda.get_device_name() or hardware.yaml's `accelerator` spells it, matches the
first pattern it contains (case-insensitive), so "H100 PCIe" is found before "H100".
"""

from __future__ import annotations

# (pattern, dense BF16 TFLOP/s per device): vendor datasheets, the sparsity figure halved where only it is given
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("h100 pcie", 756.0),  # H100 PCIe: 1,513 with sparsity
    ("h100 nvl", 835.0),  # H100 NVL: 1,671 with sparsity
    ("h200 nvl", 835.0),  # H200 NVL: 1,671 with sparsity
    ("h100", 989.0),  # H100 SXM ("NVIDIA H100 80GB HBM3"): 1,979 with sparsity
    ("h200", 989.0),  # H200 SXM and GH200: the H100 SXM's compute
    ("a100", 312.0),  # A100 SXM and PCIe, 40 and 80 GB
    ("l40s", 362.05),  # L40S datasheet, BF16 with FP32 accumulate
    ("trainium2", 166.75),  # 667 per Trainium2 chip / 4 logical NeuronCores (LNC 2)
    ("trn2", 166.75),
    ("trainium", 95.0),  # 190 per Trainium chip / 2 NeuronCores
    ("trn1", 95.0),
    ("tpu v4", 275.0),  # Cloud TPU docs, per chip
    ("tpu v5e", 197.0),
    ("tpu v5 lite", 197.0),  # how JAX names a v5e chip
    ("tpu v5p", 459.0),
)


def peak_tflops(name: str | None) -> float | None:
    """The device's dense BF16 peak, or None for an unknown device (a CPU, a GPU not in the table)."""
    key = " ".join((name or "").lower().replace("-", " ").replace("_", " ").split())
    return next((peak for pattern, peak in PEAK_TFLOPS if pattern in key), None)


def mfu(tflops_per_device: float | None, peak: float | None) -> float | None:
    """Model FLOPs utilisation: achieved model TFLOP/s per device over its peak; None if either is unknown."""
    return tflops_per_device / peak if tflops_per_device is not None and peak else None
