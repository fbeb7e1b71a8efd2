"""A resumed tp_zero1 run reads the rows an uninterrupted run reads after its checkpoint
(llmpipe.backends.neuron.resume_view). NxD's loop cannot run here (Trainium); its loader can: the
reference below is the real torch DistributedSampler + DataLoader with the arguments
tp_zero1_llama_hf_pretrain.py's create_llama_pretraining_dataset passes (read at fbac349), read epoch after
epoch as its `while True` loop does. The views are real (pack), read by the real datasets: the main
environment's and 3.6.0, which NxD's examples pin (.venvs/nxd-hf, built by .ci/run)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess

import pytest
from torch.utils.data import DataLoader, DistributedSampler

from llmpipe.backends.neuron import resume_view
from tests.conftest import REPO, corpus_docs, prepare, tiny_config, write_jsonl
from tests.test_neuron_resume import trained

NXD_PY = REPO / ".venvs" / "nxd-hf" / "bin" / "python"


def nxd_loader(rows: list[int], dp: int, rank: int, micro: int) -> DataLoader:
    """One DP rank's loader (row ids), as create_llama_pretraining_dataset builds it."""
    sampler = DistributedSampler(rows, num_replicas=dp, rank=rank, shuffle=False, drop_last=True)
    return DataLoader(rows, sampler=sampler, batch_size=micro, drop_last=True, collate_fn=list)


def nxd_batches(rows: list[int], dp: int, rank: int, micro: int):
    """The batches one DP rank reads, epoch after epoch, as NxD's tp_zero1 loop reads them."""
    loader = nxd_loader(rows, dp, rank, micro)
    while True:
        yield from loader


@pytest.mark.parametrize(
    "rows, dp, micro, accum, step, max_steps",
    [
        (100, 1, 2, 1, 3, 10),  # inside the first epoch
        (103, 4, 2, 3, 5, 9),  # rows not a multiple of DP x micro: each epoch drops the rest
        (37, 2, 3, 2, 4, 20),  # several epochs left; the checkpoint mid-epoch
        (48, 2, 2, 4, 3, 12),  # a checkpoint on an epoch's last batch
        (50, 3, 2, 5, 7, 30),  # steps that straddle epochs (5 batches a step, 8 an epoch)
    ],
)
def test_each_rank_reads_after_the_checkpoint_what_an_uninterrupted_run_reads(rows, dp, micro, accum, step, max_steps):
    parts = resume_view.segments(rows, dp, micro, accum, step, max_steps)
    resumed = [r for part in parts for r in part]
    left = (max_steps - step) * accum
    for rank in range(dp):
        want = list(itertools.islice(nxd_batches(list(range(rows)), dp, rank, micro), step * accum, max_steps * accum))
        got = list(nxd_loader(resumed, dp, rank, micro))  # one pass: the resumed view holds what is left
        assert got == want  # the same batches, in order, and no more: the run ends with the view
        assert len(got) == left


def test_too_few_rows_for_one_batch_is_named():
    with pytest.raises(ValueError, match="7 rows do not make one micro batch of 4 for each of 2 DP ranks"):
        resume_view.segments(7, 2, 4, 1, 1, 3)


@pytest.fixture(scope="module")
def view(tmp_path_factory):
    """A real hf view of several files (pack's file bound lowered), and its rows' input_ids."""
    import datasets

    from llmpipe.data.views import hf

    tmp = tmp_path_factory.mktemp("resume_view")
    write_jsonl(tmp / "corpus.jsonl", corpus_docs(60))
    cfg = tiny_config(tmp, data={"shuffle": True})
    bound = hf.MAX_FILE_BYTES
    hf.MAX_FILE_BYTES = 17 * hf.row_bytes(hf._columns(True, "int16"), cfg["train"]["seq_len"])
    try:
        out = prepare(tmp, cfg)
    finally:
        hf.MAX_FILE_BYTES = bound
    train = out["view"] / "train"
    assert len(json.loads((train / "state.json").read_text())["_data_files"]) > 2
    return out["view"], datasets.load_from_disk(str(train))["input_ids"]


def test_the_resumed_view_holds_those_rows_and_loads_with_the_datasets_nxd_pins(view, tmp_path):
    import datasets

    data, ids = view
    rows, dp, micro, accum, max_steps = len(ids), 2, 2, 3, 40  # 40 steps of 12 rows: several epochs
    ckpt = tmp_path / "nxd"
    assert resume_view.data_for(data, ckpt, dp, micro, accum, max_steps) == data  # a fresh run reads the view
    trained(ckpt, 2, 5)
    out = resume_view.data_for(data, ckpt, dp, micro, accum, max_steps)
    assert out == ckpt / resume_view.FOLDER / "step_5"
    want = [ids[r] for part in resume_view.segments(rows, dp, micro, accum, 5, max_steps) for r in part]
    assert len(want) == (max_steps - 5) * accum * micro * dp
    assert datasets.load_from_disk(str(out / "train"))["input_ids"] == want
    # whole files are the view's own (links); only the files a segment cuts are written, those rows only
    files = [f for f in (out / "train").iterdir() if f.suffix == ".arrow"]
    links = [f for f in files if f.is_symlink()]
    assert links and all(f.resolve().parent == (data / "train").resolve() for f in links)
    biggest = max(f.stat().st_size for f in (data / "train").glob("*.arrow"))
    written = [f for f in files if not f.is_symlink()]
    assert written and all(f.stat().st_size < biggest for f in written)  # step 5 starts inside a file
    if NXD_PY.exists():  # NxD's datasets (3.6.0) reads it the same
        code = "import datasets, json, sys; print(json.dumps(datasets.load_from_disk(sys.argv[1])['input_ids']))"
        read = subprocess.run([str(NXD_PY), "-c", code, str(out / "train")], capture_output=True, text=True, check=True)
        assert json.loads(read.stdout) == want
    elif os.environ.get("CI"):
        pytest.fail(f"{NXD_PY} missing: .ci/run builds it (scripts/setup-env-nxd-hf.sh)")
    # a later resume replaces the earlier one's view; a restart (no step) removes it
    trained(ckpt, 9)
    assert resume_view.data_for(data, ckpt, dp, micro, accum, max_steps).name == "step_9"
    assert [p.name for p in (ckpt / resume_view.FOLDER).iterdir()] == ["step_9"]
    for step in (2, 5, 9):
        shutil.rmtree(ckpt / f"step_{step}")
    assert resume_view.data_for(data, ckpt, dp, micro, accum, max_steps) == data
    assert not any((ckpt / resume_view.FOLDER).iterdir())


def test_a_killed_write_leaves_nothing_a_retry_keeps_and_auto_resume_is_named(view, tmp_path, caplog):
    data, _ = view
    ckpt = tmp_path / "nxd"
    trained(ckpt, 3)
    left = ckpt / resume_view.FOLDER / "step_3" / ".train.tmp-999999"  # a try killed mid-write
    left.mkdir(parents=True)
    with caplog.at_level("WARNING"):
        out = resume_view.data_for(data, ckpt, 1, 2, 1, 10, auto_resume=True)
    assert sorted(p.name for p in out.iterdir()) == ["train"]
    assert "HyperPod restarts this command as it is" in caplog.text and "the view of step_3" in caplog.text
    resume_view.clear(ckpt)  # a finished run (commands.finished)
    assert not (ckpt / resume_view.FOLDER).exists()
