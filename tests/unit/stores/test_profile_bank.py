"""The profile bank (pipelines.stores.profile_bank): concurrent writers, refused rows, bad files."""

from __future__ import annotations

import multiprocessing

import pytest
from estimate.banks import synthetic_rows

from pipelines.stores.profile_bank import BankError, ProfileBank

pytestmark = pytest.mark.trainer


def _writer(uri: str, worker: int, appends: int) -> None:
    bank = ProfileBank(uri)
    for i in range(appends):
        rows = synthetic_rows(f"w{worker}", f"k{worker}", models=1, seed=i)
        bank.append("steps", [{**r, "source": f"{worker}-{i}"} for r in rows])


def test_two_processes_writing_at_once_lose_no_row(tmp_path):
    uri = str(tmp_path / "bank")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(uri, w, 25)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rows = ProfileBank(uri).steps()
    assert len(rows) == 2 * 25 * 3
    assert {(r["source"], r["batch"]) for r in rows} == {(f"{w}-{i}", b) for w in range(2) for i in range(25) for b in (16, 64, 160)}


def test_bad_rows_are_refused_before_writing_and_bad_files_are_named(tmp_path):
    bank = ProfileBank(str(tmp_path / "bank"))
    good = synthetic_rows("fast", "k", models=1)
    with pytest.raises(BankError, match=r"steps row 1: step_s must be > 0, got -0.5"):
        bank.append("steps", [good[0], {**good[1], "step_s": -0.5}])
    with pytest.raises(BankError, match=r"steps row 0: device_key is missing"):
        bank.append("steps", [{k: v for k, v in good[0].items() if k != "device_key"}])
    assert bank.steps() == []  # nothing written by a refused append
    bank.append("steps", good)
    (tmp_path / "bank" / "steps" / "part-zzz-broken.parquet").write_text("not parquet")
    with pytest.raises(BankError, match=r"part-zzz-broken.parquet: not a readable Parquet file"):
        bank.steps()


def test_a_file_with_a_bad_value_names_file_row_and_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    bank = ProfileBank(str(tmp_path / "bank"))
    bank.append("steps", synthetic_rows("fast", "k", models=1))
    rows = synthetic_rows("fast", "k", models=1)
    rows[2]["step_s"] = float("nan")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bank" / "steps" / "part-zz-nan.parquet")
    with pytest.raises(BankError, match=r"part-zz-nan.parquet, row 2: step_s must be a finite number, got nan"):
        bank.steps()


def test_a_file_written_before_the_layer_mix_loads_and_reads_its_models_newer_twin(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.stores.profile_bank import LAYER_MIX

    bank = ProfileBank(str(tmp_path / "bank"))
    (tmp_path / "bank" / "steps").mkdir(parents=True)
    old = [{k: v for k, v in r.items() if k not in LAYER_MIX} for r in synthetic_rows("fast", "k", models=2)]
    pq.write_table(pa.Table.from_pylist(old), tmp_path / "bank" / "steps" / "part-0-old.parquet")
    rows = bank.steps()
    assert len(rows) == 6 and all(r.get(k) is None for r in rows for k in LAYER_MIX)
    again = synthetic_rows("fast", "k", models=1, seed=5)  # the first model (key0) measured again, with the layer mix
    bank.append("steps", [{**r, "model_key": "key0"} for r in again])
    rows = bank.steps()
    for r in rows:
        if r["model_key"] == "key0":
            assert {k: r[k] for k in LAYER_MIX} == {k: again[0][k] for k in LAYER_MIX}
        else:
            assert all(r.get(k) is None for k in LAYER_MIX)


def test_rows_without_the_vector_flops_read_them_tier_by_tier_from_a_newer_twin():
    from pipelines.stores.profile_bank import LAYER_MIX, VECTOR_FLOPS, complete_steps

    mixed, bare, new = synthetic_rows("fast", "k", models=3)[::3]  # three models, one row each
    mixed = {k: v for k, v in mixed.items() if k not in VECTOR_FLOPS}  # written after the layer mix, before these
    bare = {k: v for k, v in bare.items() if k not in VECTOR_FLOPS + LAYER_MIX}  # before both
    twin = {**new, "model_key": mixed["model_key"], "conv_flops_simd8_per_sample": 1.0, "conv_flops_simd16_per_sample": 2.0}
    done = complete_steps([mixed, bare, twin])
    assert (done[0]["conv_flops_simd8_per_sample"], done[0]["conv_flops_simd16_per_sample"]) == (1.0, 2.0)
    assert {k: done[0][k] for k in LAYER_MIX} == {k: mixed[k] for k in LAYER_MIX}  # its own layer mix kept
    assert all(done[1].get(k) is None for k in VECTOR_FLOPS + LAYER_MIX)  # no twin: still missing


def test_rows_without_the_convs_workspace_read_it_from_a_newer_twin_and_keep_their_other_tiers():
    from pipelines.stores.profile_bank import LAYER_MIX, VECTOR_FLOPS, WORKSPACE, complete_steps

    older, bare, new = synthetic_rows("fast", "k", models=3)[::3]
    older = {k: v for k, v in older.items() if k not in WORKSPACE}  # swept before the workspace column
    bare = {k: v for k, v in bare.items() if k not in WORKSPACE}
    twin = {**new, "model_key": older["model_key"], "conv_workspace_bytes": 123}
    done = complete_steps([older, bare, twin])
    assert done[0]["conv_workspace_bytes"] == 123
    assert {k: done[0][k] for k in LAYER_MIX + VECTOR_FLOPS} == {k: older[k] for k in LAYER_MIX + VECTOR_FLOPS}
    assert done[1].get("conv_workspace_bytes") is None  # no twin: still missing
