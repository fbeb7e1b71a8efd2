"""The data of a resumed tp_zero1 run. NxD's tp_zero1_llama_hf_pretrain.py (read at fbac349) restores the
step, weights and optimizer but reads the view from its first row again: its loader is
DistributedSampler(num_replicas=DP, shuffle=False, drop_last=True) + DataLoader(micro batch, drop_last=True),
a step every grad_accum_usteps batches, epochs end to end (`while True`), and nothing skips what the steps
before the checkpoint read. So before it resumes step N, neuron-train hands it a view holding exactly the
rows that loop reads after N steps, in order: the rest of that epoch, then whole epochs, up to
train.max_steps. Each rank's batches are then the ones an uninterrupted run reads.

Every segment starts and ends on a multiple of micro batch x DP rows, so rank r still reads rows r, r + DP,
... of each. The view's own files are linked; a file a segment cuts is written once, that slice only
(a view file holds at most 500 MB); the folder is put in place whole.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from llmpipe.backends.neuron.resume import complete_steps

log = logging.getLogger(__name__)

FOLDER = "llmpipe-resume-view"  # in the NxD checkpoint dir: <ckpt>/llmpipe-resume-view/step_<N>/train/


def segments(rows: int, dp: int, micro: int, accum: int, step: int, max_steps: int) -> list[range]:
    """The view's rows NxD's loop reads after `step` steps through `max_steps`, as ranges in reading order."""
    batches = rows // dp // micro  # each rank's batches in an epoch (both drop_last)
    if batches == 0:
        raise ValueError(f"the view's {rows} rows do not make one micro batch of {micro} for each of {dp} DP ranks")
    block = micro * dp  # the rows of one batch on every rank
    k, left, out = step * accum % batches, (max_steps - step) * accum, []
    while left > 0:
        take = min(batches - k, left)
        out.append(range(k * block, (k + take) * block))
        left, k = left - take, 0
    return out


def _table(path: Path):
    """A view file's rows, memory-mapped (pyarrow imported here: the neuron commands import this module)."""
    import pyarrow as pa

    return pa.ipc.open_stream(pa.memory_map(str(path))).read_all()


def _file_rows(folder: Path) -> list[tuple[str, int]]:
    state = json.loads((folder / "state.json").read_text())
    return [(f["filename"], _table(folder / f["filename"]).num_rows) for f in state["_data_files"]]


def _pieces(files: list[tuple[str, int]], part: range) -> list[tuple[str, int, int]]:
    """(file, first row, end row) of the files' rows in `part` (rows numbered across the files in order)."""
    out, at = [], 0
    for name, n in files:
        a, b = max(part.start, at), min(part.stop, at + n)
        if a < b:
            out.append((name, a - at, b - at))
        at += n
    return out


def write(train: Path, files: list[tuple[str, int]], out: Path, parts: list[range]) -> None:
    """A train split folder at `out` (datasets.load_from_disk reads it) holding `parts` of `train`'s rows
    (`files`: its data files and their rows, _file_rows)."""
    import pyarrow as pa

    rows_of = dict(files)
    for left in out.parent.glob(f".{out.name}.tmp-*"):  # of a killed earlier try
        shutil.rmtree(left)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.mkdir(parents=True)
    listed = []
    for part in parts:
        for name, a, b in _pieces(files, part):
            whole = (a, b) == (0, rows_of[name])
            piece = name if whole else f"{Path(name).stem}-rows-{a}-{b}.arrow"
            if not (tmp / piece).exists():
                if whole:
                    (tmp / piece).symlink_to((train / name).resolve())
                else:
                    table = _table(train / name).slice(a, b - a)
                    with open(tmp / piece, "wb") as fh, pa.ipc.new_stream(fh, table.schema) as writer:
                        writer.write_table(table, 1000)  # ArrowWriter's record batch size, as pack writes
            listed.append(piece)
    state = json.loads((train / "state.json").read_text())
    key = json.dumps([state["_fingerprint"], [[p.start, p.stop] for p in parts]])
    state.update(_fingerprint=hashlib.sha256(key.encode()).hexdigest()[:16], _data_files=[{"filename": n} for n in listed])
    (tmp / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
    shutil.copyfile(train / "dataset_info.json", tmp / "dataset_info.json")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def data_for(
    data: str | Path, ckpt_dir: str | Path, dp: int, micro: int, accum: int, max_steps: int, auto_resume: bool = False
) -> Path:
    """The hf view root tp_zero1 reads (its train/ split): `data` for a fresh run; resuming step N (NxD's
    latest_if_exists takes the newest complete step), the rows after N steps, written under the checkpoint
    dir (the views of earlier resumes removed). `auto_resume`: HyperPod reruns the command as it is."""
    data, ckpt_dir = Path(data), Path(ckpt_dir)
    steps = complete_steps(ckpt_dir)
    if auto_resume:
        log.warning(
            "train.slurm_auto_resume: HyperPod restarts this command as it is, so after an automatic restart the "
            "trainer reads %s again from its first row (it skips none): rerun snakemake to resume exactly",
            data if not steps else f"the view of step_{steps[-1]}",
        )
    root = ckpt_dir / FOLDER
    for old in sorted(root.glob("step_*")) if root.is_dir() else ():
        if not steps or old.name != f"step_{steps[-1]}":
            shutil.rmtree(old)
    if not steps:
        return data
    train = data / "train"
    files = _file_rows(train)
    parts = segments(sum(n for _, n in files), dp, micro, accum, steps[-1], max_steps)
    view = root / f"step_{steps[-1]}"
    write(train, files, view / "train", parts)
    log.info("resuming step_%d: the trainer reads %s, the rows after that step (rows %s)", steps[-1], view, _show(parts))
    return view


def _show(parts: list[range]) -> str:
    shown = ", ".join(f"{p.start}-{p.stop - 1}" for p in parts[:3])
    return shown + (f" and {len(parts) - 3} more epochs" if len(parts) > 3 else "")


def clear(ckpt_dir: str | Path) -> None:
    """Remove the resume views (a finished run reads none)."""
    shutil.rmtree(Path(ckpt_dir) / FOLDER, ignore_errors=True)
