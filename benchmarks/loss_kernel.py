"""The training loss alone on one GPU: llmpipe.train.cross_entropy's fp32 chunks compiled (the torch trainer
under train.compile) against the same chunks eager, forward + backward on bf16 logits of the 1.1B benchmark's
step (seq 4096 x micro 4 rows, vocab 32000). Checks that both give the same loss and gradients, then prints
ms per forward + backward (median of --iters after warm-up; CUDA events) and the ratio eager / compiled.

  python benchmarks/loss_kernel.py [--rows 16384] [--vocab 32000] [--iters 20]

Without a CUDA GPU it says so and exits 0 (tests/test_loss.py checks the compiled chunks on CPU).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def timed(fn, iters: int) -> float:
    import torch

    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=4 * 4096)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU available: nothing measured (tests/test_loss.py checks the compiled chunks on CPU)")
        return
    from llmpipe.data.pack import IGNORE_INDEX
    from llmpipe.train.cross_entropy import cross_entropy_sum

    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(args.rows, args.vocab, device="cuda", generator=gen) * 4).bfloat16()
    targets = torch.randint(0, args.vocab, (args.rows,), device="cuda", generator=gen)
    targets[torch.rand(args.rows, device="cuda", generator=gen) < 0.1] = IGNORE_INDEX
    x = logits.clone().requires_grad_()

    def step(compiled: bool):
        x.grad = None
        loss = cross_entropy_sum(x, targets, compiled=compiled)
        loss.backward()
        return loss

    results = {}
    for compiled in (False, True):
        for _ in range(3):  # warm-up, compile included
            loss = step(compiled)
        results[compiled] = (loss.item(), x.grad.clone(), timed(lambda c=compiled: step(c), args.iters))
    (l_eager, g_eager, t_eager), (l_comp, g_comp, t_comp) = results[False], results[True]
    rel = abs(l_comp - l_eager) / abs(l_eager)
    gb = args.rows * args.vocab * 2 * 3 / 1e9  # the floor: read the bf16 logits twice, write their gradient once
    print(
        f"{torch.cuda.get_device_name()}: bf16 logits {args.rows} x {args.vocab}; loss {l_eager:.6g} (compiled: rel diff {rel:.1e})"
    )
    print(f"  eager    {t_eager:7.2f} ms forward + backward")
    print(f"  compiled {t_comp:7.2f} ms forward + backward   eager / compiled {t_eager / t_comp:.2f}x")
    print(f"  floor of the bf16 traffic ({gb:.2f} GB): {gb / (t_comp / 1e3):.0f} GB/s achieved by the compiled form")
    assert rel < 1e-5, f"compiled loss {l_comp} vs eager {l_eager}"
    torch.testing.assert_close(g_comp, g_eager, rtol=1e-2, atol=1e-7)  # bf16 gradients


if __name__ == "__main__":
    main()
