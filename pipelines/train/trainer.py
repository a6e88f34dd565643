"""Heterogeneous synchronous training with Horovod (one process per rank).

Run under the local launcher or as a Kubernetes pod::

    python -m pipelines.launch.local -np 2 --profiles fast,slow --pool examples/pool-local.yaml -- \\
        python -m pipelines.train.trainer --spec run/spec.json --run-dir run/

Each rank trains on a local batch proportional to its measured speed; its loss is weighted by
N * b_i / B so Horovod's average of the gradients equals the gradient of the mean loss over the
global batch (docs/ARCHITECTURE.md, "Heterogeneous synchronous training").  Rank 0 alone writes checkpoints, events and the model.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

log = logging.getLogger("pipelines.train")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True, help="job spec (file or inline JSON)")
    p.add_argument("--run-dir", required=True, help="run directory holding preload/, estimate/, lr_search/")
    p.add_argument("--plan", default=None, help="plan.json (default: <run-dir>/estimate/plan.json, else equal ranks)")
    p.add_argument("--epochs", type=int, default=None, help="override spec.training.epochs (default: spec)")
    p.add_argument("--global-batch", type=int, default=None, help="override the plan's global batch")
    p.add_argument("--window", type=int, default=10, help="steps per measurement window (default: %(default)s)")
    p.add_argument("--probe-steps", type=int, default=3, help="least timed calibration steps per rank (default: %(default)s)")
    p.add_argument("--probe-seconds", type=float, default=1.0, help="least calibration time per rank (default: %(default)s)")
    p.add_argument("--no-balance", action="store_true", help="planned batches, no calibration or re-balancing")
    p.add_argument("--measure-seconds", type=float, default=2.0,
                   help="least measured time behind a re-balance decision (default: %(default)s)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (benchmarks)")
    p.add_argument("--out", default=None, help="train output folder (default: <run-dir>/train)")
    return p.parse_args(argv)


def configure_threads() -> None:
    """Match TensorFlow's thread pools to the CPU quota (before TensorFlow starts its runtime)."""
    import tensorflow as tf

    threads = int(os.environ.get("HETERO_CPU_THREADS", "0"))
    if threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = os.environ.get("HOROVOD_RANK", "0")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s rank{rank}: %(message)s")
    from pipelines.launch.rendezvous import maybe_host_rendezvous

    rendezvous = maybe_host_rendezvous()  # on Kubernetes rank 0 hosts the Gloo rendezvous
    configure_threads()
    import horovod.tensorflow as hvd

    from pipelines.train.comm import init_horovod

    init_horovod(hvd)  # joins the Gloo rendezvous (blocks until every rank has arrived)
    try:
        Trainer(args, hvd).fit()
    except TrainingError as e:
        log.error("%s", e)
        return 3
    finally:
        if rendezvous is not None:
            rendezvous.shutdown()
    return 0


class TrainingError(RuntimeError):
    """Training cannot continue (NaN loss, bad plan); every rank stops with a non-zero exit."""


class Trainer:
    def __init__(self, args: argparse.Namespace, hvd):
        import numpy as np
        import tensorflow as tf

        from pipelines.data.reader import load_split
        from pipelines.models import build_model
        from pipelines.rundir import RunDir
        from pipelines.spec import load_spec

        self.args, self.hvd, self.tf, self.np = args, hvd, tf, np
        self.rank, self.size = hvd.rank(), hvd.size()
        from pipelines.launch.cgroups import cpu_quota_cores, own_cpu_group

        group = own_cpu_group()  # this rank's cgroup (local) or its container's (pod)
        if group is not None:  # read at every measurement: a quota may change during the run
            self._quota = lambda: cpu_quota_cores(group)
        else:  # no cgroup to read: the launcher's word for the CPU limit
            share = float(os.environ.get("HETERO_CPU_SHARE", "0") or 0)
            self._quota = lambda: share or None
        self.spec = load_spec(args.spec)
        self.run_dir = RunDir(args.run_dir)
        self.out = Path(args.out) if args.out else self.run_dir.root / "train"
        self.out.mkdir(parents=True, exist_ok=True)
        t = self.spec.training
        self.epochs = args.epochs or t.epochs
        tf.keras.utils.set_random_seed(t.seed)  # Python, NumPy and TF: the same initial weights on every run

        preload = self.run_dir.read_result("preload")
        self.x, self.y = load_split(preload, "train")
        self.shape = tuple(self.spec.dataset.feature_shape)
        self.mean = float(preload.get("feature_mean", 0.0))
        self.std = float(preload.get("feature_std", 1.0)) or 1.0

        plan = self._load_plan()
        self.devices = [r["device"] for r in plan["ranks"]] if plan else ["default"] * self.size
        self.caps = [int(r.get("max_batch", 1 << 30)) for r in plan["ranks"]] if plan else [1 << 30] * self.size
        planned = [int(r["batch"]) for r in plan["ranks"]] if plan else None
        if plan and len(plan["ranks"]) != self.size:
            raise TrainingError(f"the plan has {len(plan['ranks'])} ranks but {self.size} were started")
        gb = args.global_batch or (plan["global_batch"] if plan else None)
        if gb is None:
            gb = t.global_batch if isinstance(t.global_batch, int) else 64 * self.size
        self.global_batch = int(gb)
        if planned and sum(planned) == self.global_batch:
            self.batches = planned
        else:
            from pipelines.balance import split_proportional

            self.batches = [max(1, b) for b in split_proportional(self.global_batch, [1] * self.size)]
        self.base_lr = self._learning_rate()

        self.model = build_model(self.spec.model.name, self.shape, self.spec.dataset.num_classes, self.spec.model.kwargs)
        if t.optimizer == "adam":
            self.optimizer = tf.keras.optimizers.Adam(learning_rate=self.base_lr)
        else:
            self.optimizer = tf.keras.optimizers.SGD(learning_rate=self.base_lr, momentum=0.9)
        self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.epoch_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.pos_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="rows_done_in_epoch")
        self.batches_var = tf.Variable(self.batches, dtype=tf.int64, trainable=False, name="batches")
        self.ckpt = tf.train.Checkpoint(
            model=self.model,
            optimizer=self.optimizer,
            step=self.global_step,
            epoch=self.epoch_var,
            pos=self.pos_var,
            batches=self.batches_var,
        )
        self.ckpt_dir = self.out / "checkpoints"
        self.manager = tf.train.CheckpointManager(self.ckpt, str(self.ckpt_dir), max_to_keep=3)
        self.saves: list[dict] = []
        self._build_functions()

    # ------------------------------------------------------------------------------ set-up

    def _load_plan(self) -> dict | None:
        path = Path(self.args.plan) if self.args.plan else self.run_dir.root / "estimate" / "plan.json"
        if path.is_file():
            return json.loads(path.read_text())
        if self.args.plan:
            raise TrainingError(f"{path}: plan file not found")
        return None

    def _learning_rate(self) -> float:
        from pipelines.balance import scaled_learning_rate

        t = self.spec.training
        if isinstance(t.learning_rate, float | int) and not isinstance(t.learning_rate, bool):
            return scaled_learning_rate(float(t.learning_rate), t.reference_batch, self.global_batch)
        lr_path = self.run_dir.result_path("lr_search")
        if not lr_path.is_file():
            raise TrainingError(f"learning_rate is 'auto' but {lr_path} does not exist; run lr_search first")
        found = json.loads(lr_path.read_text())
        at_batch = int(found.get("global_batch", self.global_batch))
        return scaled_learning_rate(float(found["learning_rate"]), at_batch, self.global_batch)

    def _build_functions(self) -> None:
        tf, hvd = self.tf, self.hvd
        model, optimizer = self.model, self.optimizer
        mean, std, size = self.mean, self.std, float(self.size)
        # Summed (not averaged) loss: rank i's weighted loss N * sum_i / B equals N * b_i / B times
        # its mean loss, and stays defined when a rank's slice of a short last step is empty.
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
        spec_x = tf.TensorSpec(shape=(None, *self.shape), dtype=tf.float32)
        spec_y = tf.TensorSpec(shape=(None,), dtype=tf.int32)
        scalar = tf.TensorSpec(shape=(), dtype=tf.float32)

        def forward_backward(x, y, step_batch):
            with tf.GradientTape() as tape:
                logits = model((x - mean) / std, training=True)
                weighted = loss_fn(y, logits) * (size / step_batch)  # N * b_i / B * mean loss of rank i
            grads = tape.gradient(weighted, model.trainable_variables)
            correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), y), tf.float32))
            return grads, tf.stack([weighted, correct * size / step_batch])

        @tf.function(input_signature=[spec_x, spec_y, scalar], reduce_retracing=True)
        def compute(x, y, step_batch):
            """Forward and backward only (calibration)."""
            grads, stats = forward_backward(x, y, step_batch)
            # Return something of every gradient, or the graph would prune the backward pass.
            return stats, tf.add_n([tf.reduce_sum(g) for g in grads])

        @tf.function(input_signature=[spec_x, spec_y, scalar, scalar], reduce_retracing=True)
        def train_step(x, y, step_batch, lr):
            """One synchronous step in one graph call; in-graph clocks split compute from allreduce."""
            t0 = tf.timestamp()
            with tf.control_dependencies([t0]):
                x = tf.identity(x)
            grads, stats = forward_backward(x, y, step_batch)
            with tf.control_dependencies(grads + [stats]):
                t1 = tf.timestamp()
            with tf.control_dependencies([t1]):
                # One fused allreduce of every gradient plus the loss and accuracy figures.
                reduced = hvd.grouped_allreduce(grads + [stats], op=hvd.Average)
            optimizer.learning_rate.assign(lr)
            applied = optimizer.apply_gradients(zip(reduced[:-1], model.trainable_variables))
            with tf.control_dependencies(reduced + [applied]):  # after the allreduce has delivered
                t2 = tf.timestamp()
            return reduced[-1], t1 - t0, t2 - t1

        self._compute, self._train_step = compute, train_step

    # ---------------------------------------------------------------------------- training

    def calibrate(self) -> list[float]:
        """Every rank times forward+backward at its batch; returns all ranks' samples/s."""
        tf, np = self.tf, self.np
        from pipelines.balance import sustained_rate

        b = max(1, self.batches[self.rank])
        idx = np.arange(b) % len(self.y)
        x = tf.constant(self.x[idx].reshape((-1, *self.shape)))
        y = tf.constant(self.y[idx])
        batch = tf.constant(float(b))
        self._compute(x, y, batch)[1].numpy()  # warm-up: trace and allocate
        # Time several CPU-quota periods (100 ms each), not a burst that fits inside one.
        steps, t0, cpu0 = 0, time.perf_counter(), time.process_time()
        while steps < self.args.probe_steps or time.perf_counter() - t0 < self.args.probe_seconds:
            self._compute(x, y, batch)[1].numpy()
            steps += 1
        rate = sustained_rate(b * steps, time.perf_counter() - t0, time.process_time() - cpu0, self._quota())
        return self.gather([rate])[:, 0].tolist()

    def gather(self, values: list[float]):
        """All ranks' figures as an array [size, len(values)] (same on every rank)."""
        tf = self.tf
        return self.hvd.allgather(tf.constant([values], dtype=tf.float64), name=None).numpy()

    def fit(self) -> dict:
        from pipelines.balance import (
            allocate,
            damped,
            drifted,
            epoch_steps,
            scheduled_lr,
            sustained_rate,
        )
        from pipelines.data.reader import RankInput, epoch_permutation

        tf, hvd = self.tf, self.hvd
        t = self.spec.training
        started = time.time()
        resumed_from = 0
        latest = self.manager.latest_checkpoint
        if latest:
            self.ckpt.restore(latest)  # every rank reads the same checkpoint from the shared run dir
            resumed_from = int(self.global_step.numpy())
            self.batches = [int(b) for b in self.batches_var.numpy()]
            if self.rank == 0:
                log.info("resumed from %s at step %d (epoch %d)", latest, resumed_from, int(self.epoch_var.numpy()))
        hvd.broadcast_variables(self.model.variables, root_rank=0)  # identical weights everywhere

        rebalances: list[dict] = []
        if not self.args.no_balance and not latest:
            rates = self.calibrate()
            new = allocate(rates, self.global_batch, self.caps)
            if self.rank == 0:
                log.info("calibrated samples/s %s -> local batches %s (was %s)", [round(r, 1) for r in rates], new, self.batches)
            self.batches = new
            self.batches_var.assign(new)

        writer = tf.summary.create_file_writer(str(self.out / "events")) if self.rank == 0 else None
        n = len(self.y)
        steps_per_epoch = len(epoch_steps(n, self.batches))
        warmup_steps = int(round(t.warmup_epochs * steps_per_epoch))
        total_steps = self.epochs * steps_per_epoch  # B is fixed, so every epoch has this many steps
        window = max(1, t.rebalance_every_steps or self.args.window)
        per_rank: dict[str, float] = {"compute_s": 0.0, "wait_s": 0.0, "input_s": 0.0, "samples": 0.0}
        totals = {"compute_s": 0.0, "wait_s": 0.0, "input_s": 0.0, "samples": 0.0, "step_s": 0.0}
        measured = dict.fromkeys(("samples", "busy_s", "cpu_s", "seconds"), 0.0)
        checked = False  # no re-balance decision yet in this process
        last_stats = [float("nan"), float("nan")]
        history: list[dict] = []
        inputs = RankInput(self.x, self.y, self.shape)  # one prefetching pipeline for the run
        step = int(self.global_step.numpy())
        max_steps = self.args.max_steps
        done = False

        try:
            for epoch in range(int(self.epoch_var.numpy()), self.epochs):
                order = epoch_permutation(n, t.seed, epoch)
                pos = int(self.pos_var.numpy())
                while pos < n and not done:
                    # A segment: up to `window` steps with the current batches over the rows left.
                    plan_steps = epoch_steps(n - pos, self.batches)[:window]
                    mine = [type(s[self.rank])(s[self.rank].start + pos, s[self.rank].stop + pos) for s in plan_steps]
                    seg_t0, seg_cpu0 = time.perf_counter(), time.process_time()
                    inputs.feed(order, mine)
                    for i in range(len(plan_steps)):
                        x, y = inputs.next()
                        sizes = [sl.size for sl in plan_steps[i]]
                        lr = scheduled_lr(step, self.base_lr, warmup_steps, total_steps, t.lr_schedule)
                        stats, compute_s, wait_s = self._train_step(x, y, tf.constant(float(sum(sizes))), tf.constant(lr, tf.float32))
                        reduced = stats.numpy()
                        if not math.isfinite(float(reduced[0])):
                            # Every rank sees the same reduced loss, so all stop at the same step.
                            raise TrainingError(
                                f"loss is {reduced[0]} at step {step} (epoch {epoch}); stopping every rank, "
                                f"last good checkpoint: {self._discard_checkpoints_from(step)}"
                            )
                        last_stats = [float(reduced[0]), float(reduced[1])]
                        per_rank["compute_s"] += float(compute_s)
                        per_rank["wait_s"] += float(wait_s)
                        per_rank["samples"] += sizes[self.rank]
                        step += 1
                        pos += sum(sizes)
                        self.global_step.assign(step)
                        if max_steps and step >= max_steps:
                            done = True
                            break
                        if self.rank == 0 and step % t.checkpoint_every_steps == 0:
                            self.pos_var.assign(pos)
                            self.epoch_var.assign(epoch)
                            self._save(step)
                    seg_s, seg_cpu = time.perf_counter() - seg_t0, time.process_time() - seg_cpu0
                    per_rank["input_s"] = inputs.take_wait()
                    if history:  # the first window also traces the graph: not a speed measurement
                        measured["samples"] += per_rank["samples"]
                        measured["busy_s"] += seg_s - per_rank["wait_s"]  # at work, not waiting for others
                        measured["cpu_s"] += seg_cpu
                    # Speed since the last re-balance decision: windows of a few steps are shorter than a
                    # CPU-quota period (100 ms), so decisions use at least --measure-seconds of them.
                    rate = sustained_rate(measured["samples"], measured["busy_s"], measured["cpu_s"], self._quota()) if measured["samples"] else 0.0
                    # Share the window's figures; every rank gets the same array.
                    figs = self.gather([per_rank["compute_s"], per_rank["wait_s"], per_rank["input_s"], per_rank["samples"], seg_s, rate])
                    for k, col in (("compute_s", 0), ("wait_s", 1), ("input_s", 2), ("samples", 3)):
                        totals[k] += float(figs[self.rank, col])
                    totals["step_s"] += seg_s
                    if history:
                        measured["seconds"] += float(figs[:, 4].max())  # the same on every rank
                    record = self._window_record(step, epoch, figs, last_stats, lr)
                    history.append(record)
                    if writer is not None:
                        self._write_events(writer, step, record)
                    per_rank = dict.fromkeys(per_rank, 0.0)
                    # Once enough has been measured: first as soon as that is (calibration timed the
                    # forward and backward pass alone; real steps also show each rank's fixed per-step
                    # costs), then at epoch boundaries (or every K steps).
                    due = measured["seconds"] >= self.args.measure_seconds and (pos >= n or t.rebalance_every_steps or not checked)
                    if not self.args.no_balance and due:
                        # Re-balance if measured speeds drifted (B stays fixed); every rank decides the same.
                        rates = figs[:, 5].tolist()
                        measured = dict.fromkeys(measured, 0.0)
                        checked = True
                        if drifted(self.batches, rates, t.rebalance_threshold):
                            target = allocate(rates, self.global_batch, self.caps)
                            new = damped(self.batches, target, rebalances[-1]["old"] if rebalances else None)
                            if new != self.batches:
                                event = {"step": step, "epoch": epoch, "old": self.batches, "new": new,
                                         "reason": f"measured samples/s {[round(r, 1) for r in rates]}"}
                                rebalances.append(event)
                                if self.rank == 0:
                                    log.info("re-balance at step %d: %s -> %s (%s)", step, self.batches, new, event["reason"])
                                self.batches = new
                                self.batches_var.assign(new)
                if done:  # stopped early (--max-steps): remember where, for a resume
                    self.pos_var.assign(pos)
                    self.epoch_var.assign(epoch)
                    break
                self.pos_var.assign(0)
                self.epoch_var.assign(epoch + 1)
                if self.rank == 0:
                    self._save(step)  # end of epoch
                    log.info("epoch %d done: loss %.4f accuracy %.4f step %d", epoch, last_stats[0], last_stats[1], step)

        finally:
            inputs.close()  # ends the input generator, also when a rank fails

        train_s = time.time() - started
        if self.rank == 0 and (done or self.manager.latest_checkpoint is None):
            self._save(step)
        summary = self._summary(history, totals, rebalances, last_stats, step, resumed_from, train_s)
        if self.rank == 0:
            self._export()
            writer.flush()
            from pipelines.rundir import write_json

            write_json(self.out / "summary.json", summary)
            log.info("training done in %.1fs: %s", train_s, {k: summary[k] for k in ("samples_per_sec", "final_loss")})
        return summary

    def _save(self, step: int) -> None:
        """Rank 0 writes a checkpoint; the time it takes (every rank waits for it) goes in the result."""
        t0 = time.perf_counter()
        self.manager.save(checkpoint_number=step)
        self.saves.append({"step": step, "seconds": time.perf_counter() - t0})

    def _discard_checkpoints_from(self, step: int) -> str | None:
        """After a non-finite loss at ``step``: the checkpoint of ``step`` holds the weights that
        produced it, so rank 0 deletes it (and any later one); returns the newest one kept."""
        import glob

        tf = self.tf
        found = sorted(
            (int(p.rsplit("-", 1)[1].split(".")[0]), p[: -len(".index")])
            for p in glob.glob(str(self.ckpt_dir / "ckpt-*.index"))
        )
        keep = [path for number, path in found if number < step]
        if self.rank == 0 and len(keep) < len(found):
            for number, path in found:
                if number >= step:
                    for f in glob.glob(path + ".*"):
                        os.remove(f)
            if keep:
                tf.compat.v1.train.update_checkpoint_state(str(self.ckpt_dir), keep[-1], all_model_checkpoint_paths=keep)
            else:
                (self.ckpt_dir / "checkpoint").unlink(missing_ok=True)
        return keep[-1] if keep else None

    def _window_record(self, step, epoch, figs, stats, lr) -> dict:
        from pipelines.balance import balance_efficiency

        seg = float(figs[:, 4].max())
        return {
            "step": step,
            "epoch": epoch,
            "loss": stats[0],
            "accuracy": stats[1],
            "lr": lr,
            "batches": list(self.batches),
            "compute_s": figs[:, 0].tolist(),
            "wait_s": figs[:, 1].tolist(),
            "input_s": figs[:, 2].tolist(),
            "samples": figs[:, 3].tolist(),
            "rate": figs[:, 5].tolist(),
            "seconds": seg,
            "efficiency": balance_efficiency(figs[:, 0].tolist(), seg),
        }

    def _write_events(self, writer, step: int, r: dict) -> None:
        tf = self.tf
        with writer.as_default(step=step):
            tf.summary.scalar("train/loss", r["loss"])
            tf.summary.scalar("train/accuracy", r["accuracy"])
            tf.summary.scalar("train/learning_rate", r["lr"])
            tf.summary.scalar("train/samples_per_sec", sum(r["samples"]) / max(r["seconds"], 1e-9))
            tf.summary.scalar("balance/efficiency", sum(r["efficiency"]) / len(r["efficiency"]))
            for i in range(self.size):
                tf.summary.scalar(f"rank{i}/batch", r["batches"][i])
                tf.summary.scalar(f"rank{i}/samples_per_sec", r["samples"][i] / max(r["seconds"], 1e-9))
                tf.summary.scalar(f"rank{i}/compute_s", r["compute_s"][i])
                tf.summary.scalar(f"rank{i}/wait_s", r["wait_s"][i])
                tf.summary.scalar(f"rank{i}/input_wait_s", r["input_s"][i])

    def _summary(self, history, totals, rebalances, stats, step, resumed_from, train_s) -> dict:
        np = self.np
        ranks = []
        if history:
            comp = np.sum([h["compute_s"] for h in history], axis=0)
            wait = np.sum([h["wait_s"] for h in history], axis=0)
            inp = np.sum([h["input_s"] for h in history], axis=0)
            samples = np.sum([h["samples"] for h in history], axis=0)
            wall = sum(h["seconds"] for h in history)
            for i in range(self.size):
                ranks.append({
                    "rank": i,
                    "device": self.devices[i],
                    "batch": self.batches[i],
                    "samples_per_sec": float(samples[i] / max(comp[i], 1e-9)),
                    "compute_s": float(comp[i]),
                    "wait_s": float(wait[i]),
                    "input_wait_s": float(inp[i]),
                    "balance_efficiency": float(min(1.0, comp[i] / max(wall, 1e-9))),
                })
            total_samples, total_wall = float(samples.sum()), wall
        else:
            total_samples, total_wall = 0.0, 0.0
        return {
            "global_batch": self.global_batch,
            "ranks": ranks,
            "rebalance_events": rebalances,
            "epochs": self.epochs,
            "steps": step,
            "final_loss": stats[0],
            "final_train_accuracy": stats[1],
            "train_seconds": train_s,
            "loop_seconds": total_wall,
            "samples_per_sec": total_samples / max(total_wall, 1e-9),
            "input_wait_fraction": float(max((r["input_wait_s"] for r in ranks), default=0.0) / max(total_wall, 1e-9)),
            "learning_rate": self.base_lr,
            "saved_model": str(self.out / "saved_model"),
            "events_dir": str(self.out / "events"),
            "checkpoint_dir": str(self.ckpt_dir),
            "checkpoint_saves": self.saves[-200:],  # rank 0's saves in this process: step, seconds
            "checkpoint_seconds": sum(c["seconds"] for c in self.saves),
            "resumed_from_step": resumed_from,
            "history": history[-200:],
        }

    def _export(self) -> None:
        """SavedModel with normalisation inside: ``serve(raw features) -> logits``."""
        tf = self.tf
        from pipelines.rundir import atomic_path

        model, mean, std = self.model, self.mean, self.std

        class Serving(tf.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            @tf.function(input_signature=[tf.TensorSpec(shape=(None, *self.shape), dtype=tf.float32)])
            def serve(self, x):
                return self.model((x - mean) / std, training=False)

        module = Serving()
        with atomic_path(self.out / "saved_model") as tmp:
            tf.saved_model.save(module, str(tmp), signatures={"serving_default": module.serve})


if __name__ == "__main__":
    sys.exit(main())
