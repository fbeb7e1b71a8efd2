import math

import numpy as np
import pytest

from llmpipe.train.batching import Sampler, grad_accum_steps
from llmpipe.train.schedule import lr_at

LR, MIN, WARM, MAX = 1e-3, 1e-4, 10, 110


def test_warmup_is_linear_from_zero_to_peak():
    vals = [lr_at(s, LR, MIN, WARM, MAX) for s in range(WARM)]
    assert vals[-1] == pytest.approx(LR)
    assert np.allclose(np.diff(vals), LR / WARM)
    assert vals[0] == pytest.approx(LR / WARM)


def test_cosine_decays_to_min_lr_at_last_step():
    decay = [lr_at(s, LR, MIN, WARM, MAX) for s in range(WARM, MAX)]
    assert decay[0] == pytest.approx(LR)
    assert decay[-1] == pytest.approx(MIN)
    assert all(a >= b for a, b in zip(decay, decay[1:]))
    mid = WARM + (MAX - 1 - WARM) / 2
    assert lr_at(int(mid), LR, MIN, WARM, MAX) == pytest.approx((LR + MIN) / 2, rel=0.02)
    assert lr_at(MAX + 50, LR, MIN, WARM, MAX) == pytest.approx(MIN)  # held after the end


def test_no_warmup():
    assert lr_at(0, LR, MIN, 0, MAX) == pytest.approx(LR)


@pytest.mark.parametrize("g,m,w,expected", [(16, 8, 1, 2), (16, 8, 2, 1), (512, 8, 4, 16), (8, 2, 2, 2)])
def test_grad_accumulation_arithmetic(g, m, w, expected):
    assert grad_accum_steps(g, m, w) == expected
    assert expected * m * w == g


def test_grad_accumulation_rejects_indivisible():
    with pytest.raises(ValueError, match="not a multiple"):
        grad_accum_steps(16, 3, 2)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_ranks_together_see_exactly_the_global_batch(world):
    s = Sampler(37, seed=3)
    for step in range(12):
        g = s.global_batch(step, 8)
        seen = np.concatenate([np.concatenate(s.micro_batches(step, 8, 2, r, world)) for r in range(world)])
        assert sorted(seen.tolist()) == sorted(g.tolist())


def test_each_epoch_visits_every_sample_once_and_order_differs():
    n, gb = 24, 8
    s = Sampler(n, seed=0)
    epoch0 = np.concatenate([s.global_batch(k, gb) for k in range(n // gb)])
    epoch1 = np.concatenate([s.global_batch(k, gb) for k in range(n // gb, 2 * n // gb)])
    assert sorted(epoch0.tolist()) == list(range(n)) == sorted(epoch1.tolist())
    assert epoch0.tolist() != epoch1.tolist()
    assert math.isclose(s.epoch_of(6, gb), 2.0)


def test_sampler_is_deterministic_across_instances():
    assert Sampler(50, 9).global_batch(7, 8).tolist() == Sampler(50, 9).global_batch(7, 8).tolist()
