"""The model resolver and builder (pipelines/models/__init__.py): whatever keeps a user's model
from being built is one ModelError naming model.name, the module and the cause (docs/ARCHITECTURE.md,
"Failure rules")."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.errors import EXIT_BAD_INPUT, ModelError, StageError
from pipelines.models import build_model, resolve_model

_names = itertools.count()
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def module(tmp_path, monkeypatch):
    """``module(source)`` writes a module of that source under a fresh name on sys.path; returns its name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(source: str) -> str:
        name = f"user_model_{next(_names)}"
        (tmp_path / f"{name}.py").write_text(source)
        return name

    return write


def test_a_model_error_is_a_bad_input():
    assert issubclass(ModelError, StageError) and ModelError.exit_code == EXIT_BAD_INPUT


def test_an_example_builds_with_one_logit_per_class():
    model = build_model("tiny_mlp", (4, 4, 1), 3, {"hidden": [8]})
    assert tuple(model.output_shape) == (None, 3)


def test_an_unknown_name_lists_the_examples():
    with pytest.raises(ModelError, match=r"model\.name 'smal_cnn': unknown model; use one of \['conv_net', 'embedding_net', "
                                          r"'residual_cnn', 'separable_cnn', 'small_cnn'"):
        resolve_model("smal_cnn")


def test_a_module_that_cannot_be_imported_names_the_module_its_cause_and_line(module, tmp_path):
    name = module("x = 1\nimport no_such_package_for_this_test  # noqa: F401\n")
    with pytest.raises(ModelError) as e:
        build_model(f"{name}:build", (4,), 2)
    assert str(e.value) == (
        f"model.name '{name}:build': cannot import module '{name}': ModuleNotFoundError: No module named "
        f"'no_such_package_for_this_test' at {tmp_path / name}.py:2"
    )


def test_a_module_that_does_not_exist_or_does_not_parse(module):
    with pytest.raises(ModelError, match=r"cannot import module 'no_such_user_module': ModuleNotFoundError"):
        build_model("no_such_user_module:build", (4,), 2)
    name = module("def build(:\n")
    with pytest.raises(ModelError, match=rf"model\.name '{name}:build': cannot import module '{name}': SyntaxError"):
        build_model(f"{name}:build", (4,), 2)


def test_a_missing_build_function_names_the_module_file(module, tmp_path):
    name = module("build = 3\n")
    with pytest.raises(ModelError, match=rf"module '{name}' \(.*{name}\.py\) has no callable 'build'"):
        build_model(f"{name}:build", (4,), 2)
    with pytest.raises(ModelError, match="has no callable 'other'"):
        resolve_model(f"{name}:other")


def test_a_build_function_that_raises_names_its_error_and_line(module, tmp_path):
    name = module("def build(input_shape, num_classes):\n    raise ValueError('too many layers\\nsecond line')\n")
    with pytest.raises(ModelError) as e:
        build_model(f"{name}:build", (4,), 2)
    assert str(e.value) == (
        f"model.name '{name}:build': the build function raised ValueError: too many layers at {tmp_path / name}.py:2"
    )


def test_bad_keyword_arguments_name_model_kwargs(module):
    name = module("def build(input_shape, num_classes, width=4):\n    raise AssertionError\n")
    with pytest.raises(ModelError, match=r"with model\.kwargs \{'depth': 3\} raised TypeError: .*'depth'"):
        build_model(f"{name}:build", (4,), 2, {"depth": 3})
    with pytest.raises(ModelError, match=r"model\.name 'tiny_mlp' \(pipelines\.models\.examples:tiny_mlp\): .*'layers'"):
        build_model("tiny_mlp", (4,), 2, {"layers": 3})


def test_a_result_that_is_not_a_keras_model(module):
    name = module("def build(input_shape, num_classes):\n    return {'layers': []}\n")
    with pytest.raises(ModelError, match=rf"'{name}:build': the build function returned dict, not a tf\.keras\.Model"):
        build_model(f"{name}:build", (4,), 2)


def test_an_output_that_does_not_match_the_classes(module):
    name = module(
        "import tensorflow as tf\n\n\ndef build(input_shape, num_classes):\n"
        "    inputs = tf.keras.Input(shape=input_shape)\n"
        "    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes + 1)(inputs))\n"
    )
    with pytest.raises(ModelError, match=rf"'{name}:build': the model's output shape \(None, 3\) does not end in "
                       r"dataset\.num_classes=2"):
        build_model(f"{name}:build", (4,), 2)


def test_a_subclassed_model_never_called_has_no_output_shape(module):
    name = module(
        "import tensorflow as tf\n\n\nclass Net(tf.keras.Model):\n"
        "    def __init__(self):\n        super().__init__()\n        self.out = tf.keras.layers.Dense(2)\n\n"
        "    def call(self, x):\n        return self.out(x)\n\n\n"
        "def build(input_shape, num_classes):\n    return Net()\n"
    )
    with pytest.raises(ModelError, match="the model has no output shape; build it on a tf.keras.Input"):
        build_model(f"{name}:build", (4,), 2)


def test_the_example_model_package_installs_offline_and_builds(tmp_path, monkeypatch):
    """examples/mymodels, installed as docker/examples/Dockerfile.user-model installs it (the trainer
    lock as constraints, its setuptools, no index), is the model the example job defaults name."""
    source = shutil.copytree(ROOT / "examples" / "mymodels", tmp_path / "src")  # a build writes beside its sources
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-index",
           "-c", str(ROOT / "requirements" / "trainer.lock"), "--target", str(tmp_path / "site"), str(source)]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    job = yaml.safe_load((ROOT / "examples" / "job-defaults-kubernetes.yaml").read_text())
    model = build_model(job["model"]["name"], (28, 28, 1), 10, job["model"]["kwargs"])
    assert tuple(model.output_shape) == (None, 10)
    assert model.layers[0].filters == job["model"]["kwargs"]["filters"]
