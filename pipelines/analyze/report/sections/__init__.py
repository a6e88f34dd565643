"""The report's sections, one module per subject; each registers its own with
:func:`pipelines.analyze.report.registry.section`."""
