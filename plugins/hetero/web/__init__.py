"""The pipeline's pages inside Airflow (docs/ARCHITECTURE.md, "Pages inside Airflow"): a FastAPI
app the plugin mounts on the api-server, behind Airflow's own authentication, that serves each
run's report and files and each DAG's history page read-only.

- :mod:`hetero.web.urls`: where the pages are (the prefix, the UI's tabs, the extra links' URLs)
  and the switch ``HETERO_WEB_LINKS``;
- :mod:`hetero.web.paths`: what may be served (pure functions: the run's artifact root, its
  folder, a path inside it, or a refusal);
- :mod:`hetero.web.pages`: the small HTML pages of their own (folder listings, errors);
- :mod:`hetero.web.app`: the app itself, created on the api-server's first request.
"""
