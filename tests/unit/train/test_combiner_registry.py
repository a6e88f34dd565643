"""Registered combiners and the combiner's context: names registered, refused and resolved, options
checked by the spec before any work, and what a factory is given (docs/guide/training.md,
"Combiners")."""

from __future__ import annotations

import sys

import pytest

from pipelines.spec import SpecError, load_spec
from pipelines.train import combiners
from pipelines.train.combiners import (
    CombinerContext,
    CombinerError,
    make_combiner,
    register,
    resolve_combiner,
)

BASE = {"dataset": {"uri": "data/x"}}


def spec_with(**training):
    return load_spec({**BASE, "training": {"strategy": "parameter_server", **training}})


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    monkeypatch.setattr(combiners, "_REGISTERED", {})


def factory(server, options):
    return lambda update: True


def test_a_registered_name_resolves_and_the_spec_accepts_it():
    assert register("mine", factory) is factory
    assert resolve_combiner("mine") is factory
    assert spec_with(combiner="mine").training.combiner == "mine"

    @register("decorated")
    def other(server, context):
        return lambda update: True

    assert resolve_combiner("decorated") is other and combiners.registered() == ["decorated", "mine"]


def test_an_unknown_name_lists_the_registered_ones_too():
    register("mine", factory)
    with pytest.raises(SpecError) as e:
        spec_with(combiner="minee")
    assert "training.combiner: unknown combiner 'minee'" in str(e.value) and "'mine'" in str(e.value)


def test_a_duplicate_name_is_refused_naming_both_factories():
    register("mine", factory)
    register("mine", factory)  # the same function again (a module imported twice): fine

    def another(server, options):
        return lambda update: True

    with pytest.raises(CombinerError, match=r"cannot register combiner 'mine' as .*another: .*:factory is registered"):
        register("mine", another)
    assert resolve_combiner("mine") is factory


@pytest.mark.parametrize(("name", "words"), [("plain", "a shipped combiner has that name"),
                                              ("pkg.mod:f", "a name is letters, digits"), ("", "a name is letters")])
def test_shipped_and_malformed_names_are_refused(name, words):
    with pytest.raises(CombinerError, match=words):
        register(name, factory)


def test_a_factory_of_the_wrong_signature_is_refused_at_registration():
    with pytest.raises(CombinerError, match=r"combiner 'one_arg': one_arg\(server\) cannot be called as factory"):
        @register("one_arg")
        def one_arg(server):
            return lambda update: True
    assert "one_arg" not in combiners.registered()


def test_package_module_name_imports_the_module_that_registers_the_name(tmp_path, monkeypatch):
    (tmp_path / "reg_comb_mod.py").write_text(
        "from pipelines.train.combiners import register\n\n"
        "@register('halving')\n"
        "def make(server, context):\n"
        "    return lambda update: True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "reg_comb_mod", raising=False)
    assert spec_with(combiner="reg_comb_mod:halving").training.combiner == "reg_comb_mod:halving"
    assert resolve_combiner("reg_comb_mod:halving") is sys.modules["reg_comb_mod"].make
    assert resolve_combiner("reg_comb_mod:make") is sys.modules["reg_comb_mod"].make  # the factory itself too
    with pytest.raises(SpecError, match="has no callable 'nothing' and registers no combiner of that name"):
        spec_with(combiner="reg_comb_mod:nothing")


def test_a_module_whose_registration_is_refused_is_named(tmp_path, monkeypatch):
    (tmp_path / "bad_reg_mod.py").write_text("from pipelines.train.combiners import register\n"
                                             "register('plain', lambda server, options: None)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SpecError) as e:
        spec_with(combiner="bad_reg_mod:plain")
    assert "training.combiner" in str(e.value) and "importing module 'bad_reg_mod'" in str(e.value)
    assert "a shipped combiner has that name" in str(e.value)


def test_options_are_checked_by_the_factory_before_any_work(monkeypatch):
    def strict(server, context):
        return lambda update: True

    def check(options):
        if set(options) - {"alpha"}:
            raise ValueError(f"unknown option(s) {sorted(set(options) - {'alpha'})}")

    strict.check_options = check
    register("strict", strict)
    assert spec_with(combiner="strict", combiner_options={"alpha": 1}).training.combiner_options == {"alpha": 1}
    with pytest.raises(SpecError) as e:
        spec_with(combiner="strict", combiner_options={"beta": 1})
    assert "training.combiner_options: combiner 'strict': unknown option(s) ['beta']" in str(e.value)
    with pytest.raises(SpecError, match="training.combiner_options: combiner_options may not set workers"):
        spec_with(combiner="plain", combiner_options={"workers": 3})
    with pytest.raises(SpecError, match="option lambda must be a number >= 0"):
        spec_with(combiner="dc_asgd", combiner_options={"lambda": "big"})


def test_the_factory_gets_the_context_and_an_old_style_factory_still_works():
    seen = {}

    def old_style(server, options):  # written for the options dict: reads it by key
        seen["window"], seen["max_staleness"] = options["window"], options.get("max_staleness")
        seen["context"] = options
        return lambda update: True

    register("old_style", old_style)
    training = spec_with(combiner="old_style", combine_window=7, max_staleness=3, update_mode="bounded",
                         combiner_options={"alpha": 0.5}).training
    combine = make_combiner("the server", training, workers=5)
    assert combine(None) is True and seen["window"] == 7 and seen["max_staleness"] == 3
    context = seen["context"]
    assert isinstance(context, CombinerContext)
    assert (context.workers, context.mode, context.options) == (5, "bounded", {"alpha": 0.5})
    assert dict(context) == {"window": 7, "max_staleness": 3, "workers": 5, "mode": "bounded", "alpha": 0.5}


def test_make_combiner_checks_what_the_factory_returns():
    register("returns_nothing", lambda server, options: None)
    training = spec_with(combiner="returns_nothing").training
    with pytest.raises(CombinerError, match="the factory returned None, not a function combine"):
        make_combiner(None, training, workers=2)

