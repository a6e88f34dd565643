"""One runner per launcher (docs/ARCHITECTURE.md, "Launchers"): the protocol (:mod:`~hetero.runners.protocol`:
start, resume after a deferral, kill), the local runner (:mod:`~hetero.runners.local_runner`), the pod
runner (:mod:`~hetero.runners.pod_runner`), the gang runner (:mod:`~hetero.runners.gang_runner`) and
the one table that picks a stage's runner (:mod:`~hetero.runners.table`).  Operators adapt a runner
to Airflow (:class:`hetero.operators.RunnerOperator`)."""
