"""The neuron backend's resume guard (llmpipe.backends.neuron.resume). NxD's step_<N> folders are stand-ins
here (a `model/` folder and a `done` marker, what complete_steps reads): Trainium cannot run. The
fingerprint, the refusal and the workflow's parse-time check are the real code."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from llmpipe.backends import get
from llmpipe.backends.neuron.resume import RECORD, prepare
from llmpipe.train.checkpoint import CheckpointError
from llmpipe.train.resume import changed_settings
from tests.conftest import merge
from tests.test_neuron_commands import preset


@pytest.fixture
def run(tmp_path):
    """A 7B trn1 preset's config, an initial model and a view (their bytes are what the fingerprint
    hashes), and the NxD checkpoint dir at <run>/checkpoints/neuron/nxd."""
    init, view = tmp_path / "init", tmp_path / "view"
    init.mkdir()
    view.mkdir()
    (init / "model.safetensors").write_bytes(b"weights")
    (init / "config.json").write_text("{}")
    (view / "view.json").write_text(json.dumps({"fingerprint": "v1"}))
    nxd = tmp_path / "checkpoints/neuron/nxd"
    (nxd / "pretrained_weight" / "model").mkdir(parents=True)
    return preset("llama-2-7b-trn1"), init, view, nxd


def trained(nxd, *steps):
    for s in steps:
        (nxd / f"step_{s}" / "model").mkdir(parents=True)
        (nxd / f"step_{s}" / "done").write_text("1")


def test_a_changed_setting_or_layout_is_refused_before_launch_and_before_any_job(run):
    cfg, init, view, nxd = run
    prepare(cfg, init, view, nxd)  # a fresh run records its fingerprint
    trained(nxd, 100, 200)
    prepare(cfg, init, view, nxd)  # the same settings resume
    lr = merge(cfg, {"train": {"lr": cfg["train"]["lr"] * 2}})
    with pytest.raises(CheckpointError, match=r"step_200 belongs to a different training setup .*'lr'"):
        prepare(lr, init, view, nxd)
    backend = get("neuron")
    line = changed_settings(lr, nxd.parent, "default", backend.resume_sections(lr), backend.newest_state)
    assert line.startswith("run 'default' has checkpoints trained with other settings (step_200: train.lr ")
    tp = merge(cfg, {"parallel": {"tp": cfg["parallel"]["tp"] // 2}})
    line = changed_settings(tp, nxd.parent, "default", backend.resume_sections(tp), backend.newest_state)
    assert f"neuron.tp {cfg['parallel']['tp']} -> {cfg['parallel']['tp'] // 2}" in line
    assert changed_settings(cfg, nxd.parent, "default", backend.resume_sections(cfg), backend.newest_state) is None
    (view / "view.json").write_text(json.dumps({"fingerprint": "v2"}))  # other data: refused in the job
    with pytest.raises(CheckpointError, match="data view same: False"):
        prepare(cfg, init, view, nxd)
    assert sorted(p.name for p in nxd.iterdir()) == [RECORD, "pretrained_weight", "step_100", "step_200"]  # nothing deleted


def test_resume_false_removes_the_old_steps_so_merge_cannot_take_one(run):
    """NxD writes the new run's steps beside the old ones and neuron_merge takes the newest: a restart
    with fewer steps would have exported the old run's model."""
    cfg, init, view, nxd = run
    prepare(cfg, init, view, nxd)
    trained(nxd, 100, 200)
    (nxd / "step_300").mkdir()  # a step cut short by a kill
    lr = merge(cfg, {"train": {"lr": cfg["train"]["lr"] * 2, "resume": False}})
    prepare(lr, init, view, nxd)
    assert sorted(p.name for p in nxd.iterdir()) == [RECORD, "pretrained_weight", "restart.json"]  # neuron_shard's output kept
    assert json.loads((nxd / RECORD).read_text())["fingerprint"]["train"]["lr"] == lr["train"]["lr"]
    # a retry of this restart (Slurm --retries, auto-resume: the same command) keeps the steps it trained:
    # NxD resumes them (--loading_step latest_if_exists), it does not start over
    trained(nxd, 100)
    prepare(lr, init, view, nxd)
    assert (nxd / "step_100").is_dir()
    prepare(merge(lr, {"train": {"resume": True}}), init, view, nxd)  # the restart is over: a later resume false restarts again
    assert (nxd / "step_100").is_dir() and not (nxd / "restart.json").exists()
    prepare(lr, init, view, nxd)
    assert not (nxd / "step_100").exists()


def test_a_restart_trains_with_latest_if_exists_and_extracts_from_no_checkpoint():
    """train.resume false: training asks NxD for its newest step (prepare() removed the old run's once, so
    a retry resumes the restart; "-1" made every retry start over); extraction, before prepare, none."""
    from llmpipe.backends.neuron.commands import loading_step

    assert loading_step({"resume": False}, extract=False) == "latest_if_exists"
    assert loading_step({"resume": False}, extract=True) == "-1"
    assert loading_step({"resume": True}, extract=True) == loading_step({"resume": True}, extract=False) == "latest_if_exists"


def saved_zero1(nxd, step: int, dp: int, tp: int) -> None:
    """NxD's ZeRO-1 optimizer files of one step, one per DP x TP rank, as neuronx_distributed's
    trainer/checkpoint.py (_get_path, read at 0.18.0 / fbac349 and 0.7.0) names them (xser: + .info.pt)."""
    optim = nxd / f"step_{step}" / "optim"
    optim.mkdir(parents=True)
    for d in range(dp):
        for t in range(tp):
            (optim / f"dp_rank_{d:02d}_tp_rank_{t:02d}_pp_rank_00.pt.info.pt").write_bytes(b"")


def test_zero1_optimizer_state_resumes_only_under_its_data_parallelism(run):
    """ZeRO-1 cuts the optimizer state by DP rank and NxD's load_checkpoint neither reshards nor checks it:
    more or fewer nodes (DP) are refused before any job and before launch, naming both DPs; the step's
    own files say its DP (resharded ones resume); without ZeRO-1, or restarting, other nodes are fine."""
    cfg, init, view, nxd = run
    p = cfg["parallel"]
    assert p["zero"] == 1
    dp = p["nproc_per_node"] * p["nnodes"] // (p["tp"] * p["pp"])
    more = merge(cfg, {"parallel": {"nnodes": p["nnodes"] * 2}})
    refusal = get("neuron").resume_refusal
    prepare(cfg, init, view, nxd)
    trained(nxd, 100)
    saved_zero1(nxd, 100, dp, p["tp"])
    prepare(cfg, init, view, nxd)  # the same nodes resume
    assert refusal(cfg, nxd.parent) is None
    want = (
        rf"step_100 holds ZeRO-1 optimizer state cut for data parallelism {dp}, but this run has DP {dp * 2} .*--dp_size {dp * 2}"
    )
    with pytest.raises(CheckpointError, match=want):
        prepare(more, init, view, nxd)
    assert re.search(want, refusal(more, nxd.parent))
    assert (nxd / "step_100/optim").is_dir()  # nothing deleted
    # resharded for the new DP (NxD's nxd_convert_zero_checkpoints): the files are the truth
    shutil.rmtree(nxd / "step_100/optim")
    saved_zero1(nxd, 100, dp * 2, p["tp"])
    assert refusal(more, nxd.parent) is None
    prepare(more, init, view, nxd)
    assert re.search(f"DP {dp}", refusal(cfg, nxd.parent))
    # without ZeRO-1 the optimizer state is whole (dp_rank_00 only)
    assert refusal(merge(cfg, {"parallel": {"zero": 0}}), nxd.parent) is None
    # a restart under another DP removes the old steps first; its retry resumes its own, so they are checked
    restart, restart_more = (merge(c, {"train": {"resume": False}}) for c in (cfg, more))
    assert refusal(restart_more, nxd.parent) is None  # at parse time: the steps are about to go
    prepare(restart, init, view, nxd)
    trained(nxd, 10)
    saved_zero1(nxd, 10, dp, p["tp"])
    with pytest.raises(CheckpointError, match=rf"step_10 holds ZeRO-1 optimizer state cut for data parallelism {dp},"):
        prepare(restart_more, init, view, nxd)  # the retry on other nodes
    assert (nxd / "step_10/optim").is_dir()


def test_a_checked_resume_logs_no_unchecked_warning(run, caplog):
    cfg, init, view, nxd = run
    prepare(cfg, init, view, nxd)
    trained(nxd, 100)
    with caplog.at_level("WARNING"):
        prepare(cfg, init, view, nxd)
    assert "resumed unchecked" not in caplog.text
    (nxd / RECORD).unlink()  # steps from before the record
    with caplog.at_level("WARNING"):
        prepare(cfg, init, view, nxd)
    assert "resumed unchecked" in caplog.text
