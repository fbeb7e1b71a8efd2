"""model-card: the release folder of a run: the exported model, a generated model card (README.md)
and the provenance beside it, MOF-style (Model Openness Framework: model, data, code, config).

  llmpipe model-card --config CFG --hf results/R/hf --manifest results/R/data/tokens/manifest.json \
      --sources results/R/data/sources.json --metrics results/R/train/metrics.jsonl --eval results/R/eval.json \
      --summary results/R/checkpoints/torch/final/train_summary.json --out results/R/release

The card states: architecture and size, tokenizer, data sources with the manifest's checksums and
token counts, every hyperparameter, backend and hardware, training tokens and steps, evaluation
results, the loss curve (loss.png), the pipeline version (git commit) and config, and the licences.
Nothing here reads credentials; the config holds none.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
from pathlib import Path

import yaml

from llmpipe.hub import is_hub_ref, parse_ref
from llmpipe.io import atomic_path, sha256_file, write_json

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[3]


def pipeline_version() -> dict:
    """The llmpipe package version and this checkout's git commit (+ whether it had local changes)."""
    from llmpipe import __version__

    out = {"llmpipe": __version__, "git_commit": "unknown", "git_dirty": None}
    try:
        run = lambda *a: subprocess.run(
            ["git", "-C", str(REPO_ROOT), *a],
            capture_output=True,
            text=True,  # noqa: E731
            check=True,
            timeout=10,
        ).stdout.strip()
        out["git_commit"] = run("rev-parse", "HEAD")
        out["git_dirty"] = bool(run("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def count_parameters(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():
                n = 1
                for d in f.get_slice(name).get_shape():
                    n *= d
                total += n
    return total


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _checksum(recorded) -> str | None:
    """A source's sha256 as the token store recorded it; a file read by byte ranges: `ranges:` and the sha256
    of its ranges' sha256s in order (each range's is in the store's manifest)."""
    if isinstance(recorded, list):
        import hashlib

        return "ranges:" + hashlib.sha256("".join(d or "-" for _, _, d in recorded).encode()).hexdigest()
    return recorded


def card_facts(
    cfg: dict,
    hf_dir: Path,
    manifest: dict,
    sources: dict,
    metrics: list[dict],
    evaluation: dict,
    summary: dict,
    base: dict | None = None,
) -> dict:
    """Everything the card states, as data (also written as card.json)."""
    model_cfg = json.loads((hf_dir / "config.json").read_text())
    release = cfg["hub"]["release"]
    per_source = manifest.get("by_source", {})
    data_rows = []
    for i, entry in enumerate(sources["sources"]):
        counts = per_source.get(str(i), {})
        data_rows.append(
            {
                "source": entry["source"],
                "sha256": _checksum(manifest.get("source_sha256", {}).get(entry["source"])) or entry.get("etag") or "-",
                "bytes": entry.get("size"),
                "group": entry.get("group"),
                "train_tokens": counts.get("train", {}).get("tokens", 0),
                "val_tokens": counts.get("val", {}).get("tokens", 0),
            }
        )
    last = metrics[-1] if metrics else {}
    return {
        "model": {
            "architecture": (model_cfg.get("architectures") or [model_cfg.get("model_type")])[0],
            "parameters": count_parameters(hf_dir),
            **{
                k: model_cfg.get(k)
                for k in (
                    "model_type",
                    "num_hidden_layers",
                    "hidden_size",
                    "intermediate_size",
                    "num_attention_heads",
                    "num_key_value_heads",
                    "vocab_size",
                    "max_position_embeddings",
                    "tie_word_embeddings",
                    "dtype",
                )
            },
            "rope_theta": model_cfg.get("rope_theta", (model_cfg.get("rope_parameters") or {}).get("rope_theta")),
            "base_model": base,
        },
        "tokenizer": {"source": cfg["tokenizer"]["source"], **manifest["tokenizer"]},
        "data": {
            "sources": data_rows,
            "sources_key": sources["key"],
            "store_fingerprint": manifest["fingerprint"],
            "totals": manifest["totals"],
            "mixture": sources.get("mixture"),
            "hub_datasets": cfg["hub"]["datasets"],
        },
        "hyperparameters": cfg["train"],
        "training": {
            "backend": cfg["train"]["backend"],
            "hardware": release["hardware"] or "not recorded",
            "world_size": summary.get("world_size"),
            "precision": summary.get("precision"),
            "parallel": cfg["parallel"],
            "steps": summary.get("steps", last.get("step")),
            "tokens": last.get("tokens"),
            "final_train_loss": last.get("loss"),
            "final_val_loss": summary.get("final_val_loss"),
        },
        "evaluation": evaluation,
        "pipeline": pipeline_version(),
        "licenses": {
            # from scratch: apache-2.0; a base's terms bind its derivative (a release requires the key set then)
            "model": release["license"] or ("apache-2.0" if base is None else "not set"),
            "data": release["data_license"],
            "code": release["code_license"],
        },
    }


def render(facts: dict, repo_id: str | None) -> str:
    from huggingface_hub import ModelCard, ModelCardData

    lic = facts["licenses"]
    data = ModelCardData(
        license=lic["model"] if lic["model"] in _HUB_LICENSES else "other",
        license_name=None if lic["model"] in _HUB_LICENSES else lic["model"],
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["llmpipe", "pretraining"],
        datasets=[d["id"] for d in facts["data"]["hub_datasets"]] or None,
        base_model=(facts["model"]["base_model"] or {}).get("repo_id"),
    )
    m, t, tr, ev, pv = facts["model"], facts["tokenizer"], facts["training"], facts["evaluation"], facts["pipeline"]
    parts = [
        f"# {repo_id or 'llmpipe model'}",
        "Trained with llmpipe (a Snakemake pre-training pipeline). Every figure below is read from the run's own "
        "outputs; card.json holds them as data.",
        "## Model",
        _table(
            ["field", "value"],
            [[k, v] for k, v in m.items() if k != "base_model"]
            + [["base_model", json.dumps(m["base_model"]) if m["base_model"] else "none (trained from scratch)"]],
        ),
        "## Tokenizer",
        _table(["field", "value"], [[k, v] for k, v in t.items()]),
        "## Data",
        _table(
            ["source", "sha256 / etag", "bytes", "mixture group", "train tokens", "val tokens"],
            [
                [
                    r["source"],
                    r["sha256"],
                    r["bytes"],
                    r["group"] if r["group"] is not None else "-",
                    r["train_tokens"],
                    r["val_tokens"],
                ]
                for r in facts["data"]["sources"]
            ],
        ),
        f"Totals: {json.dumps(facts['data']['totals'], sort_keys=True)}; sources key `{facts['data']['sources_key']}`, "
        f"token store fingerprint `{facts['data']['store_fingerprint']}`.",
    ]
    mix = facts["data"]["mixture"]
    if mix:
        parts.append(
            _table(
                ["group", "weight", "sampling rate", "documents", "bytes"],
                [[g["name"], g["weight"], f"{g['rate']:.6f}", g["documents"], g["bytes"]] for g in mix["groups"]],
            )
        )
    parts += [
        "## Training",
        _table(["field", "value"], [[k, v] for k, v in tr.items()]),
        "### Hyperparameters",
        _table(["train.*", "value"], [[k, v] for k, v in sorted(facts["hyperparameters"].items())]),
        "## Evaluation",
        _table(["metric", "value"], [[k, v] for k, v in sorted(ev.items())]),
        "## Loss curve",
        "![loss curve](loss.png)" if facts["training"]["tokens"] is not None else "not recorded (no metrics.jsonl)",
        "## Provenance",
        _table(["field", "value"], [[k, v] for k, v in pv.items()]),
        "The run's full config is `llmpipe_config.yaml`; the data manifest and source fingerprints are in `provenance/`.",
        "## Licences",
        _table(["component", "licence"], [[k, v] for k, v in lic.items()]),
    ]
    head = ModelCard.from_template(data, template_str="---\n{{ card_data }}\n---\n").content  # body not templated
    return ModelCard(head.rstrip("\n") + "\n\n" + "\n\n".join(parts) + "\n").content


SKIP = shutil.ignore_patterns(".snakemake_timestamp")  # Snakemake's marker in directory outputs
_HUB_LICENSES = {
    "apache-2.0",
    "mit",
    "cc-by-4.0",
    "cc-by-sa-4.0",
    "cc0-1.0",
    "bsd-3-clause",
    "llama2",
    "llama3",
    "llama3.1",
    "openrail",
    "gpl-3.0",
    "odc-by",
    "other",
}


def base_model(cfg: dict, base: str | Path | None) -> dict | None:
    """The base model as the card names it: the Hub's record of a downloaded base (`base`/hub.json), else
    model.init_from itself (a local folder: its path, the sha256 of its config.json and the size of each
    weights file, read now); None when the run started from scratch."""
    if base and (Path(base) / "hub.json").is_file():
        record = json.loads((Path(base) / "hub.json").read_text())
        return {k: record.get(k) for k in ("repo_id", "revision", "commit", "path") if record.get(k)}
    init_from = cfg["model"].get("init_from")
    if not init_from:
        return None
    if is_hub_ref(init_from):  # no downloaded folder given: the reference as configured
        repo_id, revision = parse_ref(init_from, cfg["hub"].get("revision"))
        return {"repo_id": repo_id, **({"revision": revision} if revision else {})}
    folder = Path(init_from)
    record = {"path": str(init_from)}
    if (folder / "config.json").is_file():
        record["config_sha256"] = sha256_file(folder / "config.json")
    weights = sorted(p for pattern in ("*.safetensors", "*.bin") for p in folder.glob(pattern) if p.is_file())
    return record | ({"weights_bytes": {p.name: p.stat().st_size for p in weights}} if weights else {})


def build_release(
    cfg: dict,
    hf_dir: str | Path,
    manifest: str | Path,
    sources: str | Path,
    metrics: str | Path,
    evaluation: str | Path,
    summary: str | Path,
    out: str | Path,
    data_view: str | Path | None = None,
    base: str | Path | None = None,
) -> dict:
    from llmpipe.report import plot, read_metrics

    hf_dir, out = Path(hf_dir), Path(out)
    recs = read_metrics(metrics)  # none: no curve (a backend without metrics.jsonl, or none matched)
    base_record = base_model(cfg, base)
    manifest_data = json.loads(Path(manifest).read_text())
    facts = card_facts(
        cfg,
        hf_dir,
        manifest_data,
        json.loads(Path(sources).read_text()),
        recs,
        json.loads(Path(evaluation).read_text()),
        json.loads(Path(summary).read_text()) if Path(summary).is_file() else {},
        base_record,
    )
    release = cfg["hub"]["release"]
    with atomic_path(out) as tmp:
        shutil.copytree(hf_dir, tmp, ignore=SKIP)
        if recs:
            plot(recs, tmp / "loss.png", tmp / "lr.png", cfg["run"])
        (tmp / "README.md").write_text(render(facts, release["repo_id"]))
        write_json(tmp / "card.json", facts)
        prov = tmp / "provenance"
        prov.mkdir()
        shutil.copyfile(manifest, prov / "manifest.json")
        shutil.copyfile(sources, prov / "sources.json")
        if recs:
            shutil.copyfile(metrics, prov / "metrics.jsonl")
        shutil.copyfile(evaluation, prov / "eval.json")
        if release["include_config"]:
            (tmp / "llmpipe_config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=True))
        if release["include_data"] and data_view:
            shutil.copytree(data_view, tmp / "data" / "hf", ignore=SKIP)
        files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
        write_json(tmp / "files.json", {f: sha256_file(tmp / f) for f in files})
    log.info("release folder %s: %d files", out, len(files) + 1)
    return facts


def main(argv: list[str] | None = None) -> None:
    from llmpipe import config as cfgmod

    p = argparse.ArgumentParser(
        prog="llmpipe model-card", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", required=True, help="the run's full config (YAML/JSON file or inline JSON)")
    for name in ("hf", "manifest", "sources", "metrics", "eval", "summary"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--data-view", help="packed hf view to include when hub.release.include_data")
    p.add_argument("--base", help="downloaded base model folder (its hub.json names the base model)")
    p.add_argument("--out", required=True, help="release folder to write")
    args = p.parse_args(argv)
    build_release(
        cfgmod.load(args.config),
        args.hf,
        args.manifest,
        args.sources,
        args.metrics,
        args.eval,
        args.summary,
        args.out,
        args.data_view,
        args.base,
    )
