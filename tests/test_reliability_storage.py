"""A full disk (ENOSPC), a folder without write permission (EACCES) and a read-only file system
(EROFS) under the output folder: the real CLI stops with one line naming the path, no traceback,
and leaves no partial output under the output's name.

How the conditions are made (we run as root, which bypasses permissions): a 64 KiB tmpfs mounted
for the test (ENOSPC); a 0555 folder with the process's CAP_DAC_OVERRIDE dropped by `setpriv`
(EACCES); a read-only bind mount (EROFS). Where mounting is not allowed the mount cases skip with
the reason, except under CI (`CI` set), where they fail.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, torch_train_args


def cli(args, prefix=()):
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    env.pop("LLMPIPE_DEBUG", None)
    return subprocess.run(
        [*prefix, sys.executable, "-m", "llmpipe", *args], capture_output=True, text=True, timeout=300, env=env, cwd=REPO
    )


def cannot(reason):
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture
def mount(tmp_path):
    """mount(options) -> a fresh mount point under tmp_path; unmounted afterwards."""
    points = []

    def make(kind):
        point = tmp_path / f"mnt{len(points)}"
        point.mkdir()
        if kind == "tiny":
            cmds = [["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(point)]]
        else:  # read-only bind mount of an empty folder
            src = tmp_path / f"src{len(points)}"
            src.mkdir()
            cmds = [["mount", "--bind", str(src), str(point)], ["mount", "-o", "remount,ro,bind", str(point)]]
        for i, cmd in enumerate(cmds):
            proc = subprocess.run(cmd, capture_output=True, text=True) if shutil.which("mount") else None
            if proc is None or proc.returncode:
                if i:
                    subprocess.run(["umount", str(point)])
                cannot(f"cannot mount ({' '.join(cmd)}): {proc.stderr.strip() if proc else 'no mount command'}")
        points.append(point)
        return point

    yield make
    for p in reversed(points):
        subprocess.run(["umount", "-l", str(p)])


def one_line_error(proc, command, what, path):
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"llmpipe {command}: error: ") and any(w in last for w in what), last
    assert str(path) in last, last
    return last


def commands(prepared, out):
    cfg = json.dumps(prepared["cfg"])
    return {
        "tokenize": [
            "tokenize",
            "--config",
            cfg,
            "--sources",
            str(prepared["root"] / "sources.json"),
            "--shard",
            "0",
            "--tokenizer",
            str(prepared["tokenizer"]),
            "--out",
            str(out / "tokens" / "shard-00000.safetensors"),
        ],
        "pack": [
            "pack",
            "--config",
            cfg,
            "--store",
            str(prepared["manifest"]),
            "--format",
            "hf",
            "--tokenizer",
            str(prepared["tokenizer"]),
            "--out",
            str(out / "views" / "hf"),
        ],
        "train": torch_train_args(cfg, prepared["init"], prepared["view"], out / "ckpt", out / "metrics.jsonl", out / "final"),
    }


@pytest.mark.parametrize("command", ["tokenize", "pack", "train"])
def test_disk_full_is_one_line_naming_the_path(prepared, mount, command):
    point = mount("tiny")
    argv = commands(prepared, point)[command]
    proc = cli(argv)
    one_line_error(proc, argv[0], ("no space left on device", "write failed (disk full?)"), point)
    names = [p.name for p in point.rglob("*")]
    assert not [n for n in names if ".tmp-" in n], names  # temporary files removed
    assert not (point / "tokens" / "shard-00000.safetensors").exists() and not (point / "views" / "hf").exists()
    assert not (point / "final").exists()


def test_permission_denied_is_one_line_naming_the_path(prepared, tmp_path):
    if not shutil.which("setpriv") and os.geteuid() == 0:
        cannot("setpriv not found: root bypasses folder permissions")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
    proc = cli(commands(prepared, locked)["pack"], prefix=drop if os.geteuid() == 0 else ())
    last = one_line_error(proc, "pack", ("permission denied",), locked / "views")
    assert ".tmp-" not in last  # names the output, not its temporary sibling
    assert not any(locked.iterdir())


def test_read_only_file_system_is_one_line_naming_the_path(prepared, mount):
    point = mount("ro")
    proc = cli(commands(prepared, point)["tokenize"])
    one_line_error(proc, "tokenize", ("read-only file system",), point)


def test_other_errors_keep_their_traceback(prepared, tmp_path):
    """Only storage errors are shortened: a bad argument still shows where it failed."""
    args = commands(prepared, tmp_path)["pack"]
    args[args.index("--store") + 1] = str(tmp_path / "missing" / "manifest.json")
    proc = cli(args)
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_a_folder_output_replaced_is_never_left_half_removed(tmp_path, monkeypatch):
    """A rerun (the CLI, build_view) replacing a complete folder output, killed while the old folder is being
    removed: the output name already holds the whole new folder; the old one waits under a temporary name."""
    from llmpipe import io

    target = tmp_path / "view"
    target.mkdir()
    for name in ("train", "val", "view.json"):
        (target / name).write_text("old")
    remove = io._remove

    def killed(path):  # the kill, while the old folder is removed
        if path.name.endswith("-old") and path.exists():
            raise KeyboardInterrupt
        remove(path)

    monkeypatch.setattr(io, "_remove", killed)
    with pytest.raises(KeyboardInterrupt), io.atomic_path(target) as tmp:
        tmp.mkdir()
        (tmp / "view.json").write_text("new")
    assert [p.name for p in target.iterdir()] == ["view.json"] and (target / "view.json").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".view.tmp-")] == [f".view.tmp-{os.getpid()}-old"]
