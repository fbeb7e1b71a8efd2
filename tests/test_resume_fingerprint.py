"""The resume fingerprint's digest of the initial model is read once per training world (rank 0), not by every
rank: a real 2-process gloo world started by torchrun, each rank counting the weight files it hashed. The world's
collectives time out after 2 s and rank 0 takes 4 s to read: the digest crosses on a group of its own with a
long timeout (with the world's, rank 1 gave up waiting)."""

import json
import subprocess
import sys

from llmpipe.train.resume import init_sha256

RANK_SCRIPT = """
import json, sys, time
from datetime import timedelta
import torch.distributed as dist
from llmpipe.train import resume

read = []
hash_file = resume.sha256_file
resume.sha256_file = lambda path: read.append(str(path)) or time.sleep(4 if len(read) == 1 else 0) or hash_file(path)
dist.init_process_group("gloo", timeout=timedelta(seconds=2))
digest = resume.world_init_sha256(__import__("pathlib").Path(sys.argv[1]))
with open(f"{sys.argv[2]}/rank{dist.get_rank()}.json", "w") as fh:
    json.dump({"digest": digest, "read": read}, fh)
dist.destroy_process_group()
"""


def test_rank_zero_alone_reads_the_initial_model(prepared, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    proc = subprocess.run(cmd + [str(prepared["init"]), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    expected = init_sha256(prepared["init"])  # one process, no world: it reads them itself
    assert [r["digest"] for r in ranks] == [expected, expected]
    weights = sorted(str(p) for p in prepared["init"].glob("*.safetensors"))
    assert weights and sorted(ranks[0]["read"]) == sorted(weights + [str(prepared["init"] / "config.json")])
    assert ranks[1]["read"] == []
