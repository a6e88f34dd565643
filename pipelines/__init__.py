"""Heterogeneous deep-learning training stages: plain Python, no Airflow import.

Every stage is a function ``run(spec, run_dir, ctx) -> dict`` and a command
``python -m pipelines <stage>``; the same command runs under Airflow, from a shell and in a pod.
"""

__version__ = "0.1.0"
