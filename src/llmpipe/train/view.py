"""The hf data view a trainer reads (train/ and val/ splits of packed rows), checked against train.*."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def load_view(data_dir: Path, t: dict):
    """(train, val) datasets of the view; refuses rows of another length than train.seq_len and warns
    when one global batch is more than the whole train split."""
    import datasets

    from llmpipe.model.folder import view_folder

    data_dir = view_folder(data_dir, "--data")
    train_ds = datasets.load_from_disk(str(data_dir / "train"))
    val_ds = datasets.load_from_disk(str(data_dir / "val"))
    if len(train_ds[0]["input_ids"]) != t["seq_len"]:
        raise ValueError(f"view {data_dir} has rows of {len(train_ds[0]['input_ids'])} tokens, train.seq_len is {t['seq_len']}")
    if t["global_batch_size"] > len(train_ds):
        log.warning(
            "train.global_batch_size %d exceeds the %d train rows: every step repeats rows (%.2f epochs per "
            "step); use more data or a smaller batch",
            t["global_batch_size"],
            len(train_ds),
            t["global_batch_size"] / len(train_ds),
        )
    return train_ds, val_ds
