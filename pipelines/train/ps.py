"""Parameter-server training: one program for every task of the job (docs/ARCHITECTURE.md,
"Parameter-server training").

Run by the local launcher (``pipelines.launch.local.launch_ps``) or as the pods of a Kubernetes
job, with the task's role in ``TF_CONFIG`` (``pipelines.launch.tfconfig``)::

    TF_CONFIG=... python -m pipelines.train.ps --spec run/spec.json --run-dir run/

- ``worker`` and ``ps`` tasks start a TensorFlow server and serve until they are stopped;
- the ``chief`` is the coordinator (``ParameterServerStrategy`` with ``ClusterCoordinator``): it
  builds the model on the parameter servers, feeds the epoch's rows batch by batch to whichever
  worker is free (so faster workers do more updates), writes checkpoints, events, the SavedModel
  and the result, which it prints as its last line, as rank 0 of the Horovod trainer does.

Exit codes as the Horovod trainer's (``pipelines.errors``), and 3 when a parameter server is lost:
the retry resumes from the last checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from pipelines.errors import EXIT_BAD_INPUT, EXIT_FAILED
from pipelines.train.job import TrainingError

log = logging.getLogger("pipelines.train")


class ParameterServerLost(RuntimeError):
    """A parameter server stopped answering: its variables are gone, the task fails (exit 3) and
    its retry resumes from the last checkpoint."""


def task_of(environ: dict[str, str] | None = None) -> tuple[str, int, dict]:
    """This process's role, index and cluster, from ``TF_CONFIG``."""
    from pipelines.launch.tfconfig import ENV

    text = (environ if environ is not None else os.environ).get(ENV)
    if not text:
        raise TrainingError(f"{ENV} is not set: this program runs as one task of a parameter-server job")
    try:
        config = json.loads(text)
        task = config["task"]
        return str(task["type"]), int(task.get("index", 0)), dict(config["cluster"])
    except (ValueError, KeyError, TypeError) as e:
        raise TrainingError(f"{ENV} is not a TensorFlow cluster configuration: {e}") from None


def serve(role: str, index: int) -> int:
    """A worker's or a parameter server's life: a TensorFlow server until the task is stopped."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    config = tf.compat.v1.ConfigProto()
    threads = int(os.environ.get("HETERO_CPU_THREADS", "0"))
    if threads > 0:  # the compute pool sized to the CPU quota; the inter-op pool keeps two threads
        config.intra_op_parallelism_threads = threads  # at least: a function waiting on a receive
        config.inter_op_parallelism_threads = max(2, threads)  # must not block the one running
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=role, task_index=index, protocol="grpc",
                                  config=config, start=True)
    log.info("%s %d serving at %s", role, index, resolver.cluster_spec().task_address(role, index))
    server.join()
    return 0


def main(argv: list[str] | None = None) -> int:
    from pipelines.launch.lifetime import die_with_parent
    from pipelines.train.trainer import parse_args

    die_with_parent()
    try:
        role, index, _ = task_of()
    except TrainingError as e:
        logging.basicConfig(level=logging.INFO)
        log.error("%s", e)
        return EXIT_BAD_INPUT
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s {role}{index}: %(message)s")
    if role != "chief":
        return serve(role, index)
    logging.getLogger("tensorflow").setLevel(logging.WARNING)  # the strategy logs its whole config at INFO
    code = chief(parse_args(argv))
    # The coordinator's threads (a lost worker's reconnection among them) can keep the interpreter
    # from exiting: the chief's work is written and printed, so it ends here.
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def chief(args) -> int:
    """The chief's work: train (or find the stored result) and print the result; the exit code."""
    from pipelines.sync.horovod_job import print_result
    from pipelines.train.result import completed
    from pipelines.train.trainer import failed, out_dir, result_key

    try:
        key = result_key(args)
        done = None if args.fresh else completed(out_dir(args), key)
        if done is not None:
            log.info("already trained for these inputs (input key %s); returning the stored result", key)
        else:
            from pipelines.train.ps_chief import Chief

            done = Chief(args, key).fit()
    except TrainingError as e:
        return failed(e)
    except ParameterServerLost as e:
        log.error("%s", e)
        return EXIT_FAILED
    print_result(done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
