"""The Kubernetes layer, in the provider's shape (hook -> pod manager -> operator): the provider's
hook and pod helpers (:mod:`~hetero.kube.pods`), a gang's pod logs (:mod:`~hetero.kube.pod_logs`),
its errors (:mod:`~hetero.kube.errors`), the kinds of gang (:mod:`~hetero.kube.gang_kinds`) and the
gang manager itself (:mod:`~hetero.kube.gang_manager`).  Nothing here is an operator: the trigger
(:mod:`hetero.triggers`) and the gang runner (:mod:`hetero.runners.gang_runner`) build on it."""
