"""benchmarks/gpu_cases.py's launch_case: a case failing on one rank (real torchrun, 2 gloo processes on
CPU) reports that rank's exception, told apart as OOM or error, not torchrun's summary."""

import importlib.util

import pytest

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("gpu_cases", REPO / "benchmarks" / "gpu_cases.py")
gpu_cases = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_cases)

# rank 1 raises what the case names; rank 0 waits in a barrier until it breaks (its own, later error)
CASE_SCRIPT = """
import argparse, builtins, json
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

p = argparse.ArgumentParser()
p.add_argument("--case")
p.add_argument("--result")
case = json.loads(p.parse_args().case)

def main():
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise (getattr(torch, case["raise"], None) or getattr(builtins, case["raise"]))(case["message"])
    dist.barrier()

(record(main) if case["record"] else main)()
"""


@pytest.mark.parametrize(
    "exception, message, record, kind",
    [
        ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 9.50 GiB", False, "OOM"),
        ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 7.25 GiB", True, "OOM"),  # error.json
        ("ValueError", "shape mismatch in layer 7 of the case", False, "failed"),
    ],
)
def test_failing_rank_traceback_is_reported(tmp_path, capsys, exception, message, record, kind):
    script = tmp_path / "case.py"
    script.write_text(CASE_SCRIPT)
    case = {"raise": exception, "message": message, "record": record}  # record: error.json, else stderr.log
    result = gpu_cases.launch_case(str(script), case, "tiny case", 2, 120, None)

    assert result["error"] == kind and result["world"] == 2
    tail = result["log_tail"]
    assert tail.startswith("rank 1:") and f"{exception}: {message}" in tail
    assert "Traceback (most recent call last)" in tail and "Connection closed by peer" not in tail  # not rank 0's
    assert capsys.readouterr().out.startswith(f"tiny case {kind}\nrank 1:")


def test_no_rank_traceback_falls_back_to_torchrun_output(tmp_path):
    kind, text = gpu_cases.failure(tmp_path / "no-logs", "launcher said: worker killed by SIGKILL", timed_out=False)
    assert (kind, text) == ("failed", "launcher said: worker killed by SIGKILL")
    assert gpu_cases.failure(tmp_path / "no-logs", "", timed_out=True)[0] == "timeout"


def test_results_are_written_after_each_case(tmp_path, monkeypatch):
    """A run stopped midway (a lent GPU's time running out) keeps the cases that finished."""
    import json
    from types import SimpleNamespace

    out = tmp_path / "r.json"
    done = []

    def launch(script, case, name, gpus, timeout, peak):
        if case["n"] == 2:
            assert json.loads(out.read_text()) == done  # what finished is already on disk
            raise KeyboardInterrupt  # the run is killed in its third case
        done.append({**case, "tokens_per_s_per_gpu": 10.0 * (case["n"] + 1)})
        return done[-1]

    monkeypatch.setattr(gpu_cases, "launch_case", launch)
    args = SimpleNamespace(timeout=1, peak_tflops=None, out=str(out))
    with pytest.raises(KeyboardInterrupt):
        gpu_cases.run_cases("x.py", [(f"case {n}", {"n": n}) for n in range(3)], args, 1)
    assert [r["tokens_per_s_per_gpu"] for r in json.loads(out.read_text())] == [10.0, 20.0]
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left beside it
