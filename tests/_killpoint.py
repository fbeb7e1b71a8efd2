"""Run `llmpipe <command> ...` and SIGKILL itself at the N-th instrumented event (test helper).

  python tests/_killpoint.py EVENTS_JSON N -- <llmpipe command and arguments>

Events are the moments just before and just after each call that writes state: torch.save,
safetensors save_model, os.replace (atomic renames), shutil.rmtree (old checkpoints), MetricsWriter.write
and clip_grad_norm_ (mid-step, between backward and the optimizer step). N = 0 kills nothing and
writes the names of all events, in order, to EVENTS_JSON. SIGKILL is what `kill -9` sends: the
process gets no chance to clean up.
"""

import json
import os
import shutil
import signal
import sys

import torch

import llmpipe.backends.torch.checkpoint as ckpt
from llmpipe.backends.torch import train

events_path, target = sys.argv[1], int(sys.argv[2])
events: list[str] = []


def event(name: str) -> None:
    events.append(name)
    if len(events) == target:
        os.kill(os.getpid(), signal.SIGKILL)


def hook(owner, attr: str, name: str) -> None:
    inner = getattr(owner, attr)

    def wrapped(*args, **kwargs):
        event(f"{name}:before")
        out = inner(*args, **kwargs)
        event(f"{name}:after")
        return out

    setattr(owner, attr, wrapped)


hook(torch, "save", "torch.save")
hook(ckpt, "save_model", "save_model")
hook(os, "replace", "os.replace")
hook(shutil, "rmtree", "rmtree")
hook(train.MetricsWriter, "write", "metrics")
hook(torch.nn.utils, "clip_grad_norm_", "step")

from llmpipe.__main__ import main  # noqa: E402

try:
    main(sys.argv[sys.argv.index("--") + 1 :])
finally:
    if target == 0:
        with open(events_path, "w") as fh:
            json.dump(events, fh)
