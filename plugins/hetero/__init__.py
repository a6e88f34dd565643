"""The Airflow-facing layer of the heterogeneous training pipeline.

Operators and helpers here import Airflow and the light parts of ``pipelines`` (spec, run
directory, launch); the stages themselves run in the trainer environment as subprocesses or pods.
"""
