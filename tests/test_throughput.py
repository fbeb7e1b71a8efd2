"""Model TFLOP/s and MFU: the device peak table (llmpipe.devices), its agreement with hardware.yaml, the
metrics fields (llmpipe.train.throughput) and the report's throughput figure."""

import json

import pytest
import yaml

from llmpipe import report
from llmpipe.devices import peak_tflops
from llmpipe.plan import HARDWARE_PATH, Shape, flops_per_token, matmul_parameters, parameters
from llmpipe.train.throughput import Throughput, model_flops_per_token

LLAMA_1B = {  # TinyLlama-1.1B's config.json sizes
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
}


@pytest.mark.parametrize(
    "name, peak",  # names as torch.cuda.get_device_name() gives them; dense BF16 datasheet figures
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100-PCIE-40GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA L40S", 362.05),
        ("TPU v4", 275.0),
        ("TPU v5 lite", 197.0),
        ("TPU v5p", 459.0),
        ("cpu", None),
        ("NVIDIA GeForce RTX 4090", None),
        (None, None),
    ],
)
def test_device_peak_by_name_and_mfu(name, peak):
    assert peak_tflops(name) == peak
    flops = model_flops_per_token(LLAMA_1B, 2048)
    fields = Throughput(flops, 8, name or "?", peak_tflops(name)).fields(8 * 30_000.0)
    assert fields["tflops_per_device"] == pytest.approx(30_000.0 * flops / 1e12, rel=1e-12)
    assert fields["mfu"] == (fields["tflops_per_device"] / peak if peak else None)


def test_hardware_table_agrees_with_the_device_table():
    table = yaml.safe_load(HARDWARE_PATH.read_text())
    for option, spec in table.items():
        assert peak_tflops(spec["accelerator"]) == spec["peak_tflops"], option


def test_flops_per_token_is_the_plans():
    shape = Shape.from_hf(LLAMA_1B)
    assert model_flops_per_token(LLAMA_1B, 2048) == flops_per_token(shape, matmul_parameters(shape, parameters(shape)), 2048)
    assert model_flops_per_token({"n_embd": 768, "n_layer": 12}, 1024) is None  # not Llama-shaped: no formula
    assert Throughput(None, 1, "cpu", None).fields(1000.0) == {"tflops_per_device": None, "mfu": None}


def records(device: str) -> list[dict]:
    speed = Throughput(model_flops_per_token(LLAMA_1B, 2048), 8, device, peak_tflops(device))
    return [
        {"step": s, "loss": 3.0, "lr": 1e-4, "tokens_per_s": 1e5 + 5e3 * s, **speed.fields(1e5 + 5e3 * s)} for s in range(1, 6)
    ]


def lines_by_label(fig) -> dict:
    return {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}


def test_report_plots_tokens_tflops_and_mfu_per_step():
    recs = records("NVIDIA H100 80GB HBM3")
    lines = lines_by_label(report.throughput_figure(recs))
    steps = [r["step"] for r in recs]
    for label, key, scale in (
        ("tokens/s", "tokens_per_s", 1),
        ("model TFLOP/s per device", "tflops_per_device", 1),
        ("MFU", "mfu", 100),
    ):
        assert list(lines[label].get_xdata()) == steps, label
        assert list(lines[label].get_ydata()) == pytest.approx([r[key] * scale for r in recs]), label


def test_report_without_a_device_peak_plots_tflops_and_says_why_no_mfu():
    fig = report.throughput_figure(records("cpu"))
    lines = lines_by_label(fig)
    assert "MFU" not in lines and lines["model TFLOP/s per device"].get_ydata()[0] > 0
    assert any("no MFU" in text.get_text() for ax in fig.axes for text in ax.texts)


def test_tokens_per_s_counts_the_training_steps_only(tmp_path, monkeypatch):
    """Validation and checkpoints take time between steps; tokens_per_s (and MFU from it) leaves that time out."""
    import types

    from llmpipe.train import loop
    from llmpipe.train.batching import Sampler
    from llmpipe.train.metrics import MetricsWriter

    now = [100.0]  # a clock the steps move: 2 s a step, 30 s a validation, 50 s a checkpoint
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    class Trainer:
        def train_step(self, step):
            now[0] += 2.0
            return 3.0, 1e-4, 1.0

        def validate(self):
            now[0] += 30.0
            return 2.5, 64

        def save(self, step):
            now[0] += 50.0

    t = {"global_batch_size": 4, "seq_len": 16, "max_steps": 6, "eval_interval": 2, "save_interval": 3, "log_interval": 1}
    metrics = MetricsWriter(tmp_path / "metrics.jsonl")
    loop.StepLoop(t, Sampler(64, 0), 0, metrics, True).run(Trainer())
    metrics.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6] and "val_loss" in records[1]
    assert all(r["tokens_per_s"] == pytest.approx(4 * 16 / 2.0) for r in records)
