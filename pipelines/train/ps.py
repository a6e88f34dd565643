"""Parameter-server training: one program for every task of the job (docs/ARCHITECTURE.md,
"Parameter-server training").

Run by the local launcher (``pipelines.launch.local.launch_ps``) or as the pods of a Kubernetes
job, with the task's role in ``TF_CONFIG`` (``pipelines.launch.tfconfig``)::

    TF_CONFIG=... python -m pipelines.train.ps --spec run/spec.json --run-dir run/

- ``worker`` and ``ps`` tasks start a TensorFlow server and serve until they are stopped;
- the ``chief`` is the coordinator (``ParameterServerStrategy`` with ``ClusterCoordinator``): it
  builds the model on the parameter servers, writes the training rows once where the workers read
  them (``ps_rows``), hands the epoch's rows, as indices, batch by batch to whichever worker is free
  (so faster workers do more updates), writes checkpoints, events, the SavedModel and the result,
  which it prints as its last line, as rank 0 of the Horovod trainer does.

The command line, the stored result and the exit codes are the Horovod trainer's
(``pipelines.train.command``), with 3 when a parameter server is lost: the retry resumes from the
last checkpoint.  The cluster as a task sees it is ``pipelines.train.ps_cluster``; the chief's
work ``pipelines.train.ps_chief`` (its sync rounds ``ps_rounds``), its summary's parameter-server
parts ``ps_summary``, the servers' state and update ``ps_server`` and the workers' rows ``ps_rows``.
"""

from __future__ import annotations

import logging
import os
import sys

from pipelines.core.imports import load_tensorflow
from pipelines.errors import exit_codes
from pipelines.launch.lifetime import die_with_parent
from pipelines.train.command import parse_args, train_once
from pipelines.train.ps_chief import Chief
from pipelines.train.ps_cluster import task_of

log = logging.getLogger("pipelines.train")


def serve(role: str, index: int) -> int:
    """A worker's or a parameter server's life: a TensorFlow server until the task is stopped."""
    tf = load_tensorflow()  # takes seconds to load: imported where it is used

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
    die_with_parent()
    code = task(argv)
    # The coordinator's threads (a lost worker's reconnection among them) can keep the interpreter
    # from exiting: the chief's work is written and printed (or its error), so it ends here.
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


@exit_codes
def task(argv: list[str] | None = None) -> int:
    """This task's life by its role in ``TF_CONFIG``: a worker or parameter server serves, the
    chief trains.  A bad input (the model among them) ends it with one ``ERROR:`` line and its
    exit code (pipelines.errors.exit_codes)."""
    role, index, _ = task_of()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s {role}{index}: %(message)s")
    if role != "chief":
        return serve(role, index)
    logging.getLogger("tensorflow").setLevel(logging.WARNING)  # the strategy logs its whole config at INFO
    return chief(parse_args(argv))


def chief(args) -> int:
    """The chief's work: train (or find the stored result) and print the result; the exit code
    (pipelines.train.command.train_once)."""
    return train_once(args, lambda key: Chief(args, key).fit(), prints=True)


if __name__ == "__main__":
    sys.exit(main())
