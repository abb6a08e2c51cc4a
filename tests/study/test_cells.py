"""study.cells: one key scheme through the saved npz, NotInRun (not designed) against MissingArrays (designed,
not saved), and compare handing the claims engine paired cells it judges like hand-built ones."""

from __future__ import annotations

import json

import numpy as np
import pytest

from descentlab.report.claims import NOT_IN_RUN, PENDING, Cells, ClaimSpec, MissingArrays, NotInRun, judge
from descentlab.study.cells import CELLS_FILE, DESIGN_FILE, CellStore, Design, cell_key, condition_name


def _store(seeds: int = 4, examples: int = 50) -> CellStore:
    rng = np.random.default_rng(0)
    design = Design(
        ("erm", "constrained"), (0.0, 0.5, "gaussian"), range(seeds), examples, {"gammas": [0, 1]}
    )
    store = CellStore(design)
    for arm, shift in (("erm", 0.0), ("constrained", 0.1)):
        for cond in (0.0, 0.5):
            store.put("acc", arm, cond, rng.random((seeds, examples)) + shift)
        store.put("kurtosis", arm, None, rng.normal(3 + shift, 1, (seeds, 8)))
    return store


def test_keys_are_metric_arm_condition_and_refuse_a_slash() -> None:
    assert cell_key("nll", "horst", 0.9) == "nll/horst/0.9"
    assert cell_key("nll", "horst", 0) == cell_key("nll", "horst", 0.0) == "nll/horst/0"
    assert cell_key("kurtosis", "horst") == "kurtosis/horst"
    assert condition_name("gaussian") == "gaussian" and condition_name(None) == ""
    for bad in (("a/b", "m"), ("", "m"), ("nll", "x/y")):
        with pytest.raises(ValueError, match="no '/'"):
            cell_key(*bad)
    with pytest.raises(ValueError, match="no '/'"):
        cell_key("nll", "horst", "a/b")


def test_the_store_round_trips_through_one_npz_and_the_design_record(tmp_path) -> None:
    store = _store()
    store.save(tmp_path)
    assert (tmp_path / CELLS_FILE).is_file() and (tmp_path / DESIGN_FILE).is_file()
    with np.load(tmp_path / CELLS_FILE, allow_pickle=False) as saved:
        assert sorted(saved.files) == sorted(store)
        assert "acc/constrained/0.5" in saved.files and "kurtosis/erm" in saved.files
    record = json.loads((tmp_path / DESIGN_FILE).read_text())
    assert record == {"arms": ["erm", "constrained"], "conditions": ["0", "0.5", "gaussian"],
                      "seeds": [0, 1, 2, 3], "examples": 50, "extra": {"gammas": [0, 1]}}  # fmt: skip
    back = CellStore.load(tmp_path)
    assert back.design == store.design and set(back) == set(store)
    for key in store:
        assert np.array_equal(back[key], store[key]) and back[key].dtype == store[key].dtype
    assert back.metrics() == ["acc", "kurtosis"]
    assert CellStore.load(tmp_path / "elsewhere") is None  # no design record: an older run (legacy.py)
    store.save(tmp_path / "rank1", writer=False)  # a non-writing rank writes nothing
    assert not (tmp_path / "rank1").exists()


def test_not_in_run_is_what_the_design_lacks_and_missing_arrays_what_it_did_not_save() -> None:
    store = _store()
    with pytest.raises(NotInRun, match="no resilient arm"):
        store.get("acc", "resilient", 0.5)
    with pytest.raises(NotInRun, match=r"no condition 0\.9"):
        store.get("acc", "erm", 0.9)
    with pytest.raises(MissingArrays, match="acc/erm/gaussian"):
        store.get("acc", "erm", "gaussian")  # designed, never saved
    with pytest.raises(NotInRun):
        store.put("acc", "resilient", 0.5, np.zeros((4, 50)))
    with pytest.raises(ValueError, match="not the 4 seeds"):
        store.put("acc", "erm", 0.5, np.zeros((3, 50)))
    with pytest.raises(ValueError, match="repeat"):
        Design(("erm", "erm"))


def test_compare_gives_the_engine_the_same_cells_as_hand_indexing() -> None:
    store = _store()
    cells = store.compare("acc", "constrained", "erm", 0.5, label="sparsity 0.5")
    assert (cells.method, cells.reference, cells.at) == ("constrained", "erm", "sparsity 0.5")
    assert np.array_equal(cells.a, store["acc/constrained/0.5"]) and np.array_equal(
        cells.b, store["acc/erm/0.5"]
    )
    mean = store.compare("acc", "constrained", "erm", 0.5, reduce=lambda c: c.mean(-1))
    assert mean.a.shape == (4,) and mean.at == "0.5"

    def by_store(arrays):
        yield arrays.compare("acc", "constrained", "erm", 0.5, label="s")

    def by_hand(arrays):
        yield Cells(arrays["acc/constrained/0.5"], arrays["acc/erm/0.5"], "constrained", "erm", "s")

    spec = {"metric": "accuracy", "sesoi": 0.01, "primary": True, "description": "d"}
    (a,) = judge([ClaimSpec(name="x", cells=by_store, **spec)], store)
    (b,) = judge([ClaimSpec(name="x", cells=by_hand, **spec)], store)
    assert a.to_dict() == b.to_dict() and a.estimate == pytest.approx(0.1, abs=0.1)


def test_the_engine_reads_not_in_run_and_missing_arrays_as_different_verdicts() -> None:
    def resilient(arrays):
        yield arrays.compare("acc", "resilient", "erm", 0.5)

    def unsaved(arrays):
        yield arrays.compare("acc", "constrained", "erm", "gaussian")

    spec = {"metric": "accuracy", "sesoi": 0.01, "description": "d"}
    rows = judge(
        [
            ClaimSpec(name="r", cells=resilient, **spec, primary=True),
            ClaimSpec(name="u", cells=unsaved, **spec),
        ],
        _store(),
    )
    assert [r.verdict for r in rows] == [NOT_IN_RUN, PENDING]
    assert "no resilient arm" in rows[0].reason and "acc/constrained/gaussian" in rows[1].reason
