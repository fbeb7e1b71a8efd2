"""A causal LM whose weights stay in their safetensors files (evaluate): each module's parameters are read
(pread, cast) just before that module runs and dropped right after it, so a forward pass holds about one
module's weights plus the activations, not the whole model (a 70B: ~4 GB of weights at a time, worked out,
not run). The forward pass is the whole model's (the same modules, dtype and operations), so is the loss;
the price is reading every weight again for each batch (from the page cache where the machine holds the
files). A model that reads a module's weights outside that module's forward (Llama's does not) stops
with torch's error about meta tensors, never a wrong loss."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch

from llmpipe.model.folder import FolderError
from llmpipe.model.safetensors_out import map_large_allocations
from llmpipe.model.weights import read_tensor, tensors_of, weight_files, why_not_by_name


def float32_bytes(folder: str | Path) -> int | None:
    """The model's weights in float32, from the headers (None: no safetensors weights)."""
    files = weight_files(Path(folder))
    if files is None:
        return None
    return sum(4 * math.prod(shape) for _, _, _, shape in tensors_of(files, lambda name: False).values())


def available_bytes(device: torch.device) -> int | None:
    """Memory a model on `device` may take: the GPU's; on a CPU what the machine has available (MemAvailable),
    or the process's cgroup limit (a Slurm job's mem_mb) if lower. None: unknown (not Linux)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    have = next((int(line.split()[1]) * 1024 for line in meminfo.splitlines() if line.startswith("MemAvailable:")), None)
    known = [x for x in (have, _cgroup_limit()) if x]
    return min(known) if known else None


def _cgroup_limit() -> int | None:
    """This process's cgroup memory limit (v2 memory.max, v1 memory.limit_in_bytes), at its path under the
    mount or, in a container, at the mount's root; None: none set."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        name = "memory.max" if controllers == "" else "memory.limit_in_bytes" if "memory" in controllers.split(",") else None
        root = Path("/sys/fs/cgroup") if controllers == "" else Path("/sys/fs/cgroup/memory")
        if name is None:
            continue
        for folder in (root / path.lstrip("/"), root):
            try:
                value = (folder / name).read_text().strip()
            except OSError:
                continue
            if value.isdigit() and int(value) < 1 << 60:  # v1 says "no limit" with a huge number, v2 with "max"
                return int(value)
            break
    return None


def streamed_causal_lm(folder: str | Path, device: torch.device, attention: str, dtype=torch.float32):
    """AutoModelForCausalLM of `folder` with its parameters on the meta device, each module's read from the
    safetensors files when the forward pass reaches it. Buffers (rotary frequencies) are built as usual.
    FolderError: no safetensors weights, or a parameter they do not hold (named) or hold in another shape."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    files = weight_files(folder)
    if files is None:
        raise FolderError(f"{folder}: no safetensors weights to stream (eval.stream_weights false loads other formats whole)")
    found = tensors_of(files, lambda name: False)
    config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention, trust_remote_code=False)
    model.tie_weights()  # as from_pretrained does: a tied lm_head is the embedding's parameter
    if why := why_not_by_name(model):
        raise FolderError(f"{folder}: cannot stream its weights: {why} (eval.stream_weights false loads it whole)")
    model.eval().requires_grad_(False)
    names = {}  # a parameter's names: tied weights (a Llama's lm_head and embedding) share one
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    problems = []
    for prefix, module in model.named_modules():
        for name, buf in module._buffers.items():
            if buf is not None:
                module._buffers[name] = buf.to(device)
        own = {n: p for n, p in module._parameters.items() if p is not None}
        sources = {}
        for n, p in own.items():
            full = f"{prefix}.{n}" if prefix else n
            key = next((k for k in (full, *names[id(p)]) if k in found), None)
            if key is None:
                problems.append(f"{full} (not in the weight files)")
            elif found[key][3] != tuple(p.shape):
                problems.append(f"{full} (shape {list(found[key][3])} in the files, {list(p.shape)} in config.json)")
            else:
                sources[n] = found[key]
        if sources:
            module.register_forward_pre_hook(functools.partial(_read, sources, device, dtype))
            module.register_forward_hook(functools.partial(_drop, own))
    if problems:
        more = f", +{len(problems) - 5} more" if len(problems) > 5 else ""
        raise FolderError(f"{folder}: cannot stream its weights: {', '.join(problems[:5])}{more}")
    map_large_allocations()  # a dropped tensor's memory goes back to the system at once
    return model


def _read(sources: dict, device: torch.device, dtype: torch.dtype, module, args) -> None:
    for name, src in sources.items():
        module._parameters[name] = torch.nn.Parameter(read_tensor(*src).to(device=device, dtype=dtype), requires_grad=False)


def _drop(own: dict, module, args, output) -> None:
    module._parameters.update(own)  # the meta parameters again (ties kept)
