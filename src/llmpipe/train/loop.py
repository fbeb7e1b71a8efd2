"""The step loop of every Python trainer we own (torch, colossal), in the spirit of torchtitan's
train / train_step / forward_backward split: the loop here decides when to validate, log, checkpoint and
stop; a backend's trainer does one step (`train_step`), validation (`validate`) and checkpoints (`save`).

A metrics record a step: step, loss, lr, grad_norm, tokens, epoch, tokens_per_s (training steps only: time in
validation and checkpoints left out), tflops_per_device and mfu (llmpipe.train.throughput; null where unknown)
(+ val_loss, val_tokens at validation steps, + what the trainer's optional `step_metrics()` adds, e.g. the torch
trainer's data_wait_s and step_s).
Steps count from 1: step s is the state after s optimizer steps.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from llmpipe.train.batching import Sampler
from llmpipe.train.metrics import MetricsWriter
from llmpipe.train.throughput import Throughput

log = logging.getLogger(__name__)


class Steps(Protocol):
    """What a backend's trainer gives the loop."""

    def train_step(self, step: int) -> tuple[float, float, float | None]:
        """Optimizer step `step` (0-based): (loss, lr, grad_norm), the same on every rank."""

    def validate(self) -> tuple[float, int] | None:
        """(val_loss, val_tokens), or None on ranks that do not report it."""

    def save(self, step: int) -> None:
        """A checkpoint of the state after `step` steps."""


def due(done: int, interval: int, max_steps: int) -> bool:
    return done % interval == 0 or done == max_steps


class StepLoop:
    """Runs steps start..train.max_steps of a trainer, writing metrics and logging on the main rank."""

    def __init__(
        self, t: dict, sampler: Sampler, start: int, metrics: MetricsWriter, main: bool, throughput: Throughput | None = None
    ):
        self.t, self.sampler, self.start, self.metrics, self.main = t, sampler, start, metrics, main
        self.throughput = throughput
        if main and throughput is not None:
            log.info("%s", throughput.describe())
        self.tokens_per_step = t["global_batch_size"] * t["seq_len"]
        self.clock = time.perf_counter()
        self.aside = 0.0  # seconds in validation and checkpoints: not training, kept out of tokens_per_s

    def run(self, trainer: Steps, stop_after: int | None = None) -> tuple[bool, float | None]:
        """(stopped early by `stop_after`, the last validation loss seen here or None)."""
        t, last_val = self.t, None
        for step in range(self.start, t["max_steps"]):
            done = step + 1
            record = self.record(done, *trainer.train_step(step))
            if (extra := getattr(trainer, "step_metrics", None)) is not None:
                record.update(extra())
            if due(done, t["eval_interval"], t["max_steps"]) and (val := self.timed_aside(trainer.validate)) is not None:
                record.update(val_loss=val[0], val_tokens=val[1])
                last_val = val[0]
            self.metrics.write(record)
            self.log(record)
            if due(done, t["save_interval"], t["max_steps"]) or done == stop_after:
                self.timed_aside(trainer.save, done)
            if done == stop_after and done < t["max_steps"]:
                if self.main:
                    log.info("stopping after step %d as asked (--stop-after); rerun to resume", done)
                return True, last_val
        return False, last_val

    def timed_aside(self, work, *args):
        began = time.perf_counter()
        try:
            return work(*args)
        finally:
            self.aside += time.perf_counter() - began

    def record(self, done: int, loss: float, lr: float, grad_norm: float | None) -> dict:
        elapsed = time.perf_counter() - self.clock - self.aside  # training steps only
        tokens_per_s = (done - self.start) * self.tokens_per_step / max(elapsed, 1e-9)
        return {
            "step": done,
            "loss": loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens": done * self.tokens_per_step,
            "epoch": self.sampler.epoch_of(done, self.t["global_batch_size"]),
            "tokens_per_s": tokens_per_s,
            **(self.throughput.fields(tokens_per_s) if self.throughput is not None else {}),
        }

    def log(self, record: dict) -> None:
        done, max_steps = record["step"], self.t["max_steps"]
        if self.main and (done % self.t["log_interval"] == 0 or done == max_steps or "val_loss" in record):
            grad_norm, tflops, mfu = record["grad_norm"], record.get("tflops_per_device"), record.get("mfu")
            log.info(
                "step %d/%d loss %.4f lr %.2e grad_norm %s %.0f tok/s%s%s%s",
                done,
                max_steps,
                record["loss"],
                record["lr"],
                f"{grad_norm:.3f}" if grad_norm is not None else "-",
                record["tokens_per_s"],
                f" {tflops:.3g} TFLOP/s/device" if tflops is not None else "",
                f" MFU {mfu:.1%}" if mfu is not None else "",
                f" val_loss {record['val_loss']:.4f}" if "val_loss" in record else "",
            )
