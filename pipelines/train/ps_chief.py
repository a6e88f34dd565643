"""The chief of a parameter-server job: it coordinates the workers, and alone writes checkpoints,
events, the update log, the SavedModel and the result (docs/ARCHITECTURE.md, "Parameter-server
training").

The chief walks each epoch's permutation (seeded as in Horovod mode) in batches of
b = B / N rows, and schedules one update per batch with ``ClusterCoordinator.schedule``, sending
only the batch's row indices (the worker reads the rows itself: ``pipelines.train.ps_rows``); the
coordinator hands it to whichever worker is free, so a faster worker does more updates (in
``bounded`` mode, at most ``max_staleness`` more than the slowest: ``pipelines.train.ps_clock``).
At most two updates per worker are in flight.  A deferred update (``bounded``: it gave up waiting
for an idle worker and computed nothing) has its rows scheduled again; a dropped one (a combiner
that drops, ``drop_stale``) does not.  In ``bounded`` mode a thread probes the workers and takes a
lost one out of the clocks' minimum, and puts it back when it answers again (or an update of it
arrives); a resumed run sets every clock to the largest saved one (``Clocks.rebase``).  In
``sync`` mode a round is B rows: the chief cuts them into chunks (as finely as the fastest cut
measured: ``pipelines.train.ps_rounds``) and schedules them
all; each worker takes the next chunk whenever it is free, so its share of the round follows its speed,
and adds its chunk's summed gradient to the round's sum on the servers; once every chunk is in,
the chief triggers the round's apply, which runs on the servers (``Server.apply_round``): exact
synchronous SGD with batch B.  A checkpoint waits for the updates in flight, so it holds every
update before it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import math
import time

from pipelines.core.imports import load_tensorflow
from pipelines.data.reader import epoch_permutation
from pipelines.models import build_model
from pipelines.sync.balance import compute_shares, scaled_learning_rate, scheduled_lr
from pipelines.train.checkpoints import Checkpoints
from pipelines.train.combiners import make_combiner
from pipelines.train.ps_clock import TIMEOUT_MARK, ClockWaitTimeout
from pipelines.train.ps_cluster import (
    LostWorkerWatch,
    ParameterServerLost,
    reachable,
    strategy,
    task_of,
    unreachable_servers,
    wait_for_tasks,
)
from pipelines.train.ps_rounds import Rounds
from pipelines.train.ps_rows import prepare
from pipelines.train.ps_server import MOMENTUM, Server, build_update, horovod_form, parse_record
from pipelines.train.ps_summary import Tally, parameter_server_section, worker_figures
from pipelines.train.rank_job import DivergedError, TrainingError, load_job
from pipelines.train.result import PARAMETER_SERVER, RunFigures, RunSummary
from pipelines.train.training_run import TrainingRun

log = logging.getLogger("pipelines.train")

IN_FLIGHT_PER_WORKER = 2
MAX_TRANSIENT = 100  # updates lost on the way (with a worker) before the task gives up
UPDATES_FILE = "updates.jsonl"


@dataclasses.dataclass
class Pending:
    """An update scheduled and not yet collected."""

    value: object  # the coordinator's RemoteValue
    rows: object  # the row indices it trains on (trained again when deferred or lost on the way)


class Chief(TrainingRun):
    """The coordinator: the strategy, the model on the servers, the update, the loop."""

    def __init__(self, args, key: str):
        tf = load_tensorflow()  # takes seconds to load: a chief that finds a stored result never does

        self.tf = tf
        _, _, cluster = task_of()
        self.cluster, self.workers = cluster, len(cluster.get("worker", []))
        super().__init__(args, key, load_job(args, self.workers), writes=True)  # the chief alone writes
        job = self.job
        t = self.t = job.spec.training
        self.mode = t.update_mode
        self.batch = max(1, job.placement.global_batch // self.workers)  # an update's batch (sync: in chunks)
        self.round_rows = job.placement.global_batch if self.mode == "sync" else 0  # sync: a round's rows
        self.rounds = Rounds(self.workers) if self.round_rows else None
        wait_for_tasks(cluster)
        self.strategy = strategy(tf, len(cluster.get("ps", [])))
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(self.strategy)
        tf.keras.utils.set_random_seed(t.seed)
        with self.strategy.scope():
            self.model = build_model(job.spec.model.name, job.shape, job.spec.dataset.num_classes, job.spec.model.kwargs)
        self.momentum = server_momentum(t, self.workers)
        self.server = server = Server(self.strategy, self.model, t.optimizer, self.momentum, workers=self.workers,
                                      keras_momentum=horovod_form(t.update_mode, self.workers))
        try:
            self.combine = make_combiner(server, t, self.workers)
        except ValueError as e:
            raise TrainingError(f"training.combiner: {e}") from None
        # the rows, written once where every worker reads them by index: the chief sends indices only
        key = str(job.run_dir.read_result("preload").get("input_key", ""))
        self.rows, self.rows_figures = prepare(job.out / "rows", job.x, job.y, job.shape, key)
        self.timings["rows_store_write_s"] = self.rows_figures["rows_store_write_s"]
        self.update = build_update(server, self.model, self.combine, self.mode, t.max_staleness, job.mean, job.std,
                                   self.rows)
        self.apply_round = tf.function(lambda lr: server.apply_round(self.combine, lr))
        state = tf.train.Checkpoint(**server.trackables())
        self.checkpoints = Checkpoints(job.out / "checkpoints", self.model, state, [self.batch] * self.workers)
        self.tally = Tally.of(self.workers)
        self.updates_file = job.out / UPDATES_FILE
        self.records: list[dict] = []  # updates not yet written to the update log
        self.window: list[dict] = []  # the current window's update records
        self.step = 0  # applied updates (async, bounded) or rounds (sync): the schedule's step
        self.started = self.window_t0 = time.perf_counter()
        self.transients = 0  # updates that failed on the way and were scheduled again
        self.transient_errors = (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.AbortedError)
        self.watcher: LostWorkerWatch | None = None  # bounded mode's watch for lost workers (watch())

    # ------------------------------------------------------------------------------ the loop

    def fit(self) -> dict:
        """Resume or start (warm); schedule every epoch's updates; save, export, summarise.
        Returns the stage result (pipelines.train.result)."""
        job, ckpt, t = self.job, self.checkpoints, self.t
        began = time.time()
        resumed_from = self.resume()
        self.open_events(self.workers)
        n = len(job.y)
        per_epoch = math.ceil(n / (self.round_rows or self.batch))
        self.total_steps, self.warmup = job.epochs * per_epoch, int(round(t.warmup_epochs * per_epoch))
        # Linear scaling: an update of b rows moves at the rate for b; a sync round's mean, at B's.
        self.rate = job.base_lr if self.mode == "sync" else scaled_learning_rate(job.base_lr, job.placement.global_batch, self.batch)
        self.timings["startup_s"] = time.time() - began
        self.events.histograms(self.step, self.model.trainable_variables)
        self.started = self.window_t0 = time.perf_counter()
        self.start_progress(self.step)
        try:
            with self.watch():
                for epoch in range(int(ckpt.epoch.numpy()), job.epochs):
                    order = epoch_permutation(n, t.seed, epoch)
                    if self.run_epoch(epoch, order, int(ckpt.pos.numpy())):
                        break  # --max-steps reached
                    ckpt.mark(epoch + 1, 0)
                    self.save(self.step)
                    log.info("epoch %d done: loss %.4f accuracy %.4f step %d", epoch, *self.last, self.step)
        except self.tf.errors.UnavailableError as e:
            raise self.lost(e) from None
        except self.tf.errors.InvalidArgumentError as e:
            if TIMEOUT_MARK not in str(e):
                raise
            raise self.stalled(e) from None
        train_s = time.time() - began
        self.end_window()
        self.save(self.step)
        result = self.finish(self.step, resumed_from or 0, train_s, self.local_model())
        self.rows.remove()  # trained: the workers' copy of the rows is no longer needed (a retry writes it again)
        return result

    def run_epoch(self, epoch: int, order, pos: int) -> bool:
        """Schedule the epoch's batches from row ``pos`` on; True when ``--max-steps`` was reached."""
        flight: collections.deque[Pending] = collections.deque()
        every, max_steps, n = self.t.checkpoint_every_steps, self.args.max_steps, len(order)
        next_save = (self.step // every + 1) * every
        while pos < n:
            if self.mode == "sync":
                pos = self.sync_round(order, pos)
            else:
                rows = order[pos : pos + self.batch]
                pos += len(rows)
                flight.append(self.schedule(rows))
                while len(flight) >= IN_FLIGHT_PER_WORKER * self.workers:
                    self.collect(flight.popleft(), flight)
            if max_steps and self.step >= max_steps:
                self.settle(flight)
                self.checkpoints.mark(epoch, pos)
                return True
            if self.step >= next_save:
                self.settle(flight)
                self.checkpoints.mark(epoch, pos)
                self.save(self.step)
                next_save = (self.step // every + 1) * every
        self.settle(flight)
        return False

    def schedule(self, rows) -> Pending:
        """One update of ``rows`` at the schedule's current rate, to the next free worker, which
        reads the rows itself: only their indices travel."""
        tf = self.tf
        lr = scheduled_lr(self.step, self.rate, self.warmup, self.total_steps, self.t.lr_schedule)
        args = (tf.constant(rows, tf.int64), tf.constant(lr, tf.float32))
        while True:  # bounded: transient() fails the task after MAX_TRANSIENT
            try:
                return Pending(self.coordinator.schedule(self.update, args=args), rows)
            except tf.errors.OpError as e:
                # an earlier update's failure, raised once by the coordinator; another update may
                # fail before this one is queued, and the coordinator raises that one next
                if not self.is_transient(e):
                    raise
                self.transient(e)

    def collect(self, pending: Pending, flight: collections.deque) -> None:
        """Wait for one update and record it; a deferred one, or one lost with its worker, is
        scheduled again (same rows)."""
        try:
            r = parse_record(pending.value.fetch())
        except self.tf.errors.OpError as e:
            if not self.is_transient(e):
                raise
            self.transient(e)
            flight.append(self.schedule(pending.rows))
            return
        self.heard_from(r["worker"])
        if r["deferred"]:
            log.debug("worker %d deferred an update after %.2f s: the workers it waited for were idle",
                      r["worker"], r["clock_wait_s"])
            self.tally.defer(r)
            flight.append(self.schedule(pending.rows))
            return
        self.record(r)

    def watch(self):
        """In ``bounded`` mode, the thread that takes a lost worker out of the clocks' minimum and
        puts it back when it answers again (:attr:`watcher`)."""
        if self.mode != "bounded" or self.workers < 2:
            return contextlib.nullcontext()
        self.watcher = LostWorkerWatch(self.cluster.get("worker", []), self.worker_lost, self.worker_back)
        return self.watcher

    def worker_lost(self, worker: int) -> None:
        """(The watch's thread.)  ``worker`` does not answer: the others stop waiting for its clock."""
        try:
            self.server.clocks.mark_lost(worker)
            log.warning("worker %d (%s) does not answer: the others no longer wait for its clock", worker,
                        self.cluster["worker"][worker])
        except Exception as e:  # a server gone too: the main loop fails the task
            log.warning("could not mark worker %d lost: %s", worker, e)

    def worker_back(self, worker: int) -> None:
        """(The watch's thread, or the loop's: :meth:`heard_from`.)  A lost worker answers again."""
        try:
            self.server.clocks.mark_live(worker)
            log.warning("worker %d (%s) answers again: the others wait for its clock again (raised to the "
                        "slowest live worker's)", worker, self.cluster["worker"][worker])
        except Exception as e:  # a server gone too: the main loop fails the task
            log.warning("could not mark worker %d live again: %s", worker, e)

    def heard_from(self, worker: int) -> None:
        """An update of ``worker`` came back.  One the watch had marked lost is live again, if its
        address answers now: the update shows it was alive when it ran, but the chief may collect
        it long after (it collects in the order it scheduled), from a worker that has died since."""
        watch = self.watcher
        if watch is not None and worker in watch.lost and reachable(self.cluster["worker"][worker], timeout=0.5):
            watch.back(worker)

    def is_transient(self, error) -> bool:
        """Whether an update's failure is one of a worker lost on the way, which its rows survive.
        TensorFlow's coordinator re-queues the failures it recognises as a worker's (a lost
        connection, a cancelled call) and hands the others to the chief; most of those that come
        from a lost worker are the three :attr:`transient_errors`, but a worker killed mid-call
        can surface as another error naming it (TensorFlow's own note: "worker failure can manifest
        as a Graph execution error UnknownError").  Such an error counts as transient only while
        some worker's address no longer answers; a clock wait's timeout never does (it names a
        stalled worker: :meth:`stalled`)."""
        if isinstance(error, self.transient_errors):
            return True
        text = str(error)
        return (TIMEOUT_MARK not in text and "/job:worker" in text
                and any(not reachable(a, timeout=0.5) for a in self.cluster.get("worker", [])))

    def transient(self, error) -> None:
        """An update failed on the way (a worker lost while it ran, or cancelled with it): fine
        while every parameter server answers (its rows are trained again); otherwise the task
        fails (:meth:`lost`).  More than :data:`MAX_TRANSIENT` such failures fail it too."""
        self.transients += 1
        if self.transients > MAX_TRANSIENT or unreachable_servers(self.cluster):
            raise self.lost(error)
        if self.mode == "bounded":
            # The failed update's worker may have left its busy mark set, and a waiter for a worker
            # marked busy never gives up (even while the chief drains): it would wait for the
            # timeout and fail the task.  Neither the error nor the coordinator says which worker
            # ran it, nor which workers run the updates still in flight, so every mark is cleared:
            # a worker whose update is running re-marks itself at its next start, and until its
            # tick a waiter for it may defer (its rows are scheduled again: a little work lost,
            # no bound loosened) instead of waiting.  settle() clears them again once nothing runs.
            self.server.clocks.clear_busy()
        log.warning("an update failed (%s: %s); its rows are scheduled again", type(error).__name__,
                    (str(error).splitlines() or [""])[0])

    def settle(self, flight: collections.deque) -> None:
        """Collect every update in flight, and the re-tries of deferred ones (in ``bounded`` mode
        the servers are told: a wait for an idle worker then gives up at once).  Then no update
        runs, so in ``bounded`` mode every busy mark is cleared (one an update that failed on the
        way left set would hold its waiters until the timeout: see :meth:`transient`)."""
        draining = self.mode == "bounded" and bool(flight)
        if draining:
            self.server.clocks.drain(True)
        while flight:
            self.collect(flight.popleft(), flight)
        if draining:
            self.server.clocks.drain(False)
        if self.mode == "bounded":
            self.server.clocks.clear_busy()

    def sync_round(self, order, pos: int) -> int:
        """One round: the next B rows in chunks to whichever worker is free (so each worker's
        share follows its speed), then the round's mean applied once, on the servers."""
        rows, began = order[pos : pos + self.round_rows], time.perf_counter()
        chunks = self.rounds.cut(rows)
        flight = collections.deque(self.schedule(c) for c in chunks)
        self.settle(flight)
        shares = self.rounds.end(len(chunks), time.perf_counter() - began)
        log.debug("round %d: %d chunks, shares %s", self.step, len(chunks), [round(s, 3) for s in shares])
        lr = scheduled_lr(self.step, self.rate, self.warmup, self.total_steps, self.t.lr_schedule)
        self.apply_round(self.tf.constant(lr, self.tf.float32))
        self.step += 1
        return pos + len(rows)

    # ------------------------------------------------------------------------------ records

    def record(self, r: dict) -> None:
        """One collected update: the tally, the update log, and a window record every 10 updates
        per worker; a non-finite loss stops the job (as in Horovod mode)."""
        t = time.perf_counter() - self.started
        loss = float(r["loss"])
        if not math.isfinite(loss):
            raise DivergedError(f"loss is {loss} at update {sum(self.tally.updates) + 1} "
                                f"(step {self.step}); last good checkpoint: {self.checkpoints.manager.latest_checkpoint}")
        self.tally.add(r, t)
        admitted = r["admitted"]
        if admitted and self.mode != "sync":
            self.step += 1
        row = {"worker": r["worker"], "staleness": r["staleness"], "applied": admitted,
               "samples": int(r["samples"]), "loss": loss, "version": r["version"], "t": round(t, 4),
               "compute_s": r["compute_s"], "wait_s": r["wait_s"], "correct": r["correct"],
               "clock": r["clock"], "clock_gap": r["clock_gap"], "clock_gap_first": r["clock_gap_first"],
               "clock_wait_s": r["clock_wait_s"], "clocks": r["clocks"]}
        if self.rounds is not None:  # sync: the round it belongs to, and its worker's speed
            row["round"] = self.step
            self.rounds.add(r["worker"], float(r["samples"]), r["compute_s"] + r["wait_s"])
        self.records.append(row)
        self.window.append(row)
        if len(self.window) >= 10 * self.workers:
            self.end_window()

    def end_window(self) -> None:
        """The window's record (the Horovod trainer's keys, per worker) into history and events."""
        rows, now = self.window, time.perf_counter()
        if not rows:
            return
        seconds = max(now - self.window_t0, 1e-9)
        per = [[r for r in rows if r["worker"] == w] for w in range(self.workers)]
        compute = [sum(r["compute_s"] for r in p) for p in per]
        samples = [float(sum(r["samples"] for r in p if r["applied"])) for p in per]
        done = [r for r in rows if r["applied"]] or rows
        record = {
            "step": self.step, "epoch": int(self.checkpoints.epoch.numpy()),
            "loss": sum(r["loss"] for r in done) / len(done),
            "accuracy": sum(r["correct"] for r in done) / max(1.0, sum(r["samples"] for r in done)),
            "lr": scheduled_lr(self.step, self.rate, self.warmup, self.total_steps, self.t.lr_schedule),
            "batches": [self.batch] * self.workers, "samples": samples, "compute_s": compute,
            "wait_s": [sum(r["wait_s"] + r["clock_wait_s"] for r in p) for p in per], "input_s": [0.0] * self.workers,
            "rate": [s / max(c, 1e-9) for s, c in zip(samples, compute, strict=True)],
            "seconds": seconds, "loop_s": seconds, "efficiency": compute_shares(compute, seconds),
            "updates": [len(p) for p in per],
            "staleness_mean": sum(r["staleness"] for r in rows) / len(rows),
        }
        if self.rounds is not None:  # sync: each worker's share of the window's rounds
            record["round_share"] = [s / max(1.0, sum(samples)) for s in samples]
        self.history.append(record)
        self.last = (record["loss"], record["accuracy"])
        self.events.write(self.step, record)
        self.report_progress(record, self.total_steps)
        with self.events.writer.as_default(step=self.step):
            self.tf.summary.scalar("parameter_server/staleness_mean", record["staleness_mean"])
            for w in range(self.workers):
                self.tf.summary.scalar(f"rank{w}/updates", record["updates"][w])
                if self.rounds is not None:
                    self.tf.summary.scalar(f"rank{w}/round_share", record["round_share"][w])
        self.window, self.window_t0 = [], now

    def flush_records(self) -> None:
        """Append the updates collected since the last flush to the update log."""
        if not self.records:
            return
        with open(self.updates_file, "a") as f:
            for row in self.records:
                f.write(json.dumps(row) + "\n")
        self.records = []

    # ------------------------------------------------------------------------------ state

    def resume(self) -> int | None:
        """Restore the newest checkpoint into the servers' variables (TrainingRun.resume) and set
        every worker's clock to the largest restored one (``Clocks.rebase``: a worker slow or lost
        before the restart would otherwise hold the others back in ``bounded`` mode until it caught
        up; the report's per-worker update counts come from the update records, not the clocks);
        when there is none, a new update log and, with ``training.warm_start``, the promoted weights."""
        step = super().resume()
        if step is None:
            self.updates_file.unlink(missing_ok=True)  # training from the start: a new log
            self.warm_start()
        else:
            self.step = step
            restored = self.server.clocks.values()
            top = self.server.clocks.rebase()
            if restored != [top] * len(restored):
                log.info("clocks %s restored; every worker's set to %d: the bound applies from here", restored, top)
        return step

    def save(self, step: int) -> None:
        """A checkpoint at ``step`` (every update before it is in it) and the weights' histograms
        (TrainingRun.save), and the update log so far."""
        self.checkpoints.step.assign(step)
        super().save(step)
        self.flush_records()

    def lost(self, error) -> ParameterServerLost:
        """The error for a parameter server that stopped answering, naming the unreachable ones."""
        gone = unreachable_servers(self.cluster)
        cause = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
        resume = f"the retry resumes from the last checkpoint ({self.checkpoints.manager.latest_checkpoint or 'none: from the start'})"
        if not gone:  # every server still answers: a connection failed on the way
            return ParameterServerLost(f"a remote call failed while every parameter server still answers ({cause}); "
                                       f"the task fails and {resume}")
        return ParameterServerLost(f"parameter server lost: {', '.join(gone)} does not answer ({cause}); the variables "
                                   f"it held are gone, so the task fails; {resume}")

    def stalled(self, error) -> ClockWaitTimeout:
        """The error for a bounded-mode wait that timed out (the message names both workers)."""
        text = next((line for line in str(error).splitlines() if TIMEOUT_MARK in line), str(error))
        text = text[text.index(TIMEOUT_MARK):].rstrip("]")
        return ClockWaitTimeout(f"training.update_mode bounded: {text}; the task fails and the retry resumes from "
                                f"the last checkpoint ({self.checkpoints.manager.latest_checkpoint or 'none'})")

    # ------------------------------------------------------------------------------ the end

    def local_model(self):
        """The trained model as an ordinary (unsharded) Keras model on the chief, read back from
        the last checkpoint (a sharded variable is saved whole, so any number of servers fits)."""
        job = self.job
        local = build_model(job.spec.model.name, job.shape, job.spec.dataset.num_classes, job.spec.model.kwargs)
        self.tf.train.Checkpoint(model=local).restore(self.checkpoints.manager.latest_checkpoint).expect_partial()
        return local

    def figures(self) -> RunFigures:
        """The workers as the run's ranks (pipelines.train.ps_summary.worker_figures)."""
        return worker_figures(self.tally, self.job.placement.devices, self.batch, self.history)

    def summary(self, step: int, resumed_from: int, train_s: float) -> RunSummary:
        """The Horovod trainer's summary (TrainingRun.summary) with the parameter server's parts."""
        return dataclasses.replace(super().summary(step, resumed_from, train_s), strategy=PARAMETER_SERVER,
                                   updates=sum(self.tally.updates), parameter_server=parameter_server_section(self))


def server_momentum(training, workers: int) -> float:
    """The servers' SGD momentum: 0.9, as Horovod mode's, in sync mode or with one worker (so one
    worker trains exactly as one Horovod rank).  In async and bounded modes, a number in
    ``training.async_momentum`` as it is, or ``"auto"``: in async mode 0.9 less the momentum that N
    workers' asynchrony adds by itself, 1 - 1/N (Mitliagkas et al. 2016, "Asynchrony begets
    momentum"), never below 0; in bounded mode 0.9, since SSP's near-rounds make a fixed delay of
    about N - 1 changes, which is not momentum (docs/ARCHITECTURE.md, "Parameter-server training";
    measured by bench/strategies.py)."""
    if horovod_form(training.update_mode, workers):
        return MOMENTUM
    if training.async_momentum == "auto":
        return MOMENTUM if training.update_mode == "bounded" else corrected_momentum(workers)
    return float(training.async_momentum)


def corrected_momentum(workers: int, target: float = MOMENTUM) -> float:
    """``target`` less the implicit momentum of ``workers`` asynchronous workers, 1 - 1/N, at least 0:
    0.4 for 2 workers, 0.233 for 3, 0 from 10."""
    return round(max(0.0, target - (1.0 - 1.0 / workers)), 6)
