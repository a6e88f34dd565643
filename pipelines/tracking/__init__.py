"""Optional MLflow tracking of publish, analyze and promote (``tracking`` in the job spec;
docs/ARCHITECTURE.md, "Model versions and promotion").

:mod:`~pipelines.tracking.session` opens the MLflow run of an Airflow run and turns MLflow's errors
into the stages' (exit 2 or 3); :mod:`~pipelines.tracking.stages` is what each stage logs.  MLflow
is imported only when ``tracking.mlflow_uri`` is set.  No Airflow import.
"""
