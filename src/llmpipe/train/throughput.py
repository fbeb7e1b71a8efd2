"""Model TFLOP/s per device and MFU for each metrics record (llmpipe.train.loop).

FLOPs per token are the plan's (llmpipe.plan.arithmetic.flops_per_token: 6 N_matmul + 12 L q s, forward and backward,
recomputation not counted) for the HF config of the model being trained; the peak is the device's dense
BF16 figure (llmpipe.devices), unknown on CPU or an unlisted GPU: MFU is null then, TFLOP/s still given.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from llmpipe.devices import mfu, peak_tflops
from llmpipe.plan.arithmetic import Shape, flops_per_token, matmul_parameters, parameters

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Throughput:
    """What turns the global tokens/s of a step into model TFLOP/s per device and MFU."""

    flops_per_token: int | None  # None: the model is not Llama-shaped (no formula for it)
    devices: int  # ranks the global tokens/s is shared over
    device: str  # as torch names it
    peak_tflops: float | None

    def fields(self, tokens_per_s: float) -> dict:
        tflops = None if self.flops_per_token is None else tokens_per_s * self.flops_per_token / self.devices / 1e12
        return {"tflops_per_device": tflops, "mfu": mfu(tflops, self.peak_tflops)}

    def describe(self) -> str:
        flops = "unknown" if self.flops_per_token is None else f"{self.flops_per_token:,}"
        peak = "unknown: no MFU" if self.peak_tflops is None else f"{self.peak_tflops:g}"
        return (
            f"model FLOPs per token {flops} (llmpipe.plan.arithmetic), {self.devices} x {self.device}, peak BF16 TFLOP/s {peak}"
        )


def model_flops_per_token(hf_config: dict, seq_len: int) -> int | None:
    try:
        shape = Shape.from_hf(hf_config)
    except ValueError as exc:
        log.warning("no model TFLOP/s or MFU in the metrics: %s", exc)
        return None
    return flops_per_token(shape, matmul_parameters(shape, parameters(shape)), seq_len)


def device_name(device) -> str:
    """torch's name of a torch.device: the GPU's model for CUDA, else the device type ("cpu")."""
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def throughput_of(hf_config: dict, seq_len: int, devices: int, device) -> Throughput:
    """The Throughput of training the model of `hf_config` (a dict) on `devices` ranks of torch.device `device`."""
    name = device_name(device)
    return Throughput(model_flops_per_token(hf_config, seq_len), devices, name, peak_tflops(name))
