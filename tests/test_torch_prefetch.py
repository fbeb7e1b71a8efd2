"""Rows of the next step are read by a background thread while the current one runs (train.prefetch);
the wait is measured (data_wait_s in metrics) and the rows are the same as reading them in the step."""

import threading
import time

import pytest

from llmpipe.train.prefetch import Prefetcher
from tests.test_train_torch import losses, run_train


def test_prefetcher_hands_steps_in_order_and_stays_bounded():
    reads, lock = [], threading.Lock()

    def read(step):
        with lock:
            reads.append(step)
        return step * 10

    rows = Prefetcher(read, 3, 9, depth=1)
    time.sleep(0.2)  # the thread runs ahead as far as the queue lets it: one queued + one in hand
    assert len(reads) <= 2
    assert [rows.get(s) for s in range(3, 9)] == [30, 40, 50, 60, 70, 80]
    rows.close()
    with pytest.raises(RuntimeError, match="step 4 where step 3"):
        other = Prefetcher(read, 4, 9, depth=2)
        other.get(3)
    other.close()


def test_prefetcher_passes_on_a_read_error_and_close_ends_the_thread():
    def read(step):
        if step == 2:
            raise OSError("disk gone")
        return step

    rows = Prefetcher(read, 0, 100, depth=1)
    assert rows.get(0) == 0 and rows.get(1) == 1
    with pytest.raises(OSError, match="disk gone"):
        rows.get(2)
    rows.close()
    endless = Prefetcher(lambda s: s, 0, 10**9, depth=2)
    endless.get(0)
    endless.close()
    assert not endless._thread.is_alive()


def test_reading_overlaps_the_step():
    """A 0.1 s read beside a 0.2 s step: after the first step the step waits for nothing (< 0.05 s),
    where reading in the step (depth 0) waits the whole 0.1 s."""

    def read(step):
        time.sleep(0.1)
        return step

    def waits(depth):
        rows, out = Prefetcher(read, 0, 6, depth=depth), []
        for s in range(6):
            rows.get(s)
            out.append(rows.wait_s)
            time.sleep(0.2)  # the step's compute
        rows.close()
        return out

    ahead, inline = waits(1), waits(0)
    assert max(ahead[1:]) < 0.05, ahead
    assert min(inline) >= 0.1, inline


def test_trainer_prefetch_gives_the_same_run_and_reports_data_wait(prepared, tmp_path):
    steps = {"max_steps": 4, "eval_interval": 4}
    ahead, _ = run_train(prepared, tmp_path, "ahead", cfg_over={"train": {**steps, "prefetch": 2}})
    inline, _ = run_train(prepared, tmp_path, "inline", cfg_over={"train": {**steps, "prefetch": 0}})
    a, b = losses(ahead), losses(inline)
    assert [r["loss"] for r in a] == [r["loss"] for r in b]  # bitwise: the same rows in the same order
    for r in a + b:
        assert 0 <= r["data_wait_s"] <= r["step_s"]
