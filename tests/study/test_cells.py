"""study.cells: one key scheme through the saved npz, NotInRun (not designed) against MissingArrays (designed,
not saved), and compare handing the claims engine paired cells it judges like hand-built ones."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from descentlab.report.claims import NOT_IN_RUN, PENDING, Cells, ClaimSpec, MissingArrays, NotInRun, judge
from descentlab.study.cells import (
    CELLS_FILE,
    DESIGN_FILE,
    CellStore,
    Design,
    cell_key,
    condition_name,
    load_store,
    record_design,
    require_store,
)


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


def test_a_condition_on_its_own_seeds_is_kept_checked_and_round_tripped(tmp_path) -> None:
    # a side arm measured on fresh seeds (sparse-vit's paper-like arm): its arrays follow its own seeds
    design = Design(("a", "b"), (0.9, "side"), (0, 1, 2), 20, condition_seeds={"side": (7, 8)})
    assert design.seeds_at(0.9) == (0, 1, 2) and design.seeds_at("side") == (7, 8)
    store = CellStore(design)
    store.put("acc", "a", "side", np.ones((2, 20)))
    store.put("acc", "b", "side", np.zeros((2, 20)))
    store.put("acc", "a", 0.9, np.ones((3, 20)))
    with pytest.raises(ValueError, match="not the 2 seeds"):
        store.put("acc", "b", "side", np.zeros((3, 20)))  # the main seeds' shape is wrong here
    with pytest.raises(ValueError, match="not the 3 seeds"):
        store.put("acc", "b", 0.9, np.zeros((2, 20)))
    cells = store.compare("acc", "a", "b", "side")
    assert cells.a.shape == cells.b.shape == (2, 20)
    store.save(tmp_path)
    record = json.loads((tmp_path / DESIGN_FILE).read_text())
    assert record["condition_seeds"] == {"side": [7, 8]}
    assert CellStore.load(tmp_path).design == design
    # a design without own seeds writes the record as before (no condition_seeds key)
    assert "condition_seeds" not in Design(("a",), seeds=(0,)).to_dict()
    with pytest.raises(ValueError, match="lacks"):
        Design(("a",), (0.9,), condition_seeds={"other": (1,)})
    # a condition designed on no seeds was not measured: the engine reads it as not in this run
    empty = Design(("a", "b"), ("side",), (0, 1), condition_seeds={"side": ()})
    with pytest.raises(NotInRun, match="on no seeds"):
        CellStore(empty).get("acc", "a", "side")


def test_the_store_saves_under_the_record_the_runner_wrote_and_refuses_another_design(tmp_path) -> None:
    # the runner writes the config's design before the run (no examples yet, the γ grid in extra)
    planned = Design(("constrained", "erm"), ("gaussian", 0.5, 0.0), range(4), None, {"gammas": [0, 1, 2]})
    record_design(tmp_path, planned)
    assert CellStore.load(tmp_path).design == planned  # before any array: every claim pends
    store = _store()  # the same arms, conditions and seeds (other orders), 50 examples, its own γ grid
    store.save(tmp_path)
    saved = CellStore.load(tmp_path).design
    assert saved == replace(store.design, extra={"gammas": [0, 1]}) and saved.examples == 50
    merged = Design(("erm",), (), (0,), extra={"planned": True, "gammas": [9]})
    record_design(tmp_path / "other", merged)
    CellStore(Design(("erm",), (), (0,), 3, {"measured": 1.5})).save(tmp_path / "other")
    assert CellStore.load(tmp_path / "other").design.extra == {
        "planned": True,
        "gammas": [9],
        "measured": 1.5,
    }

    # a run that measured other arms, conditions or seeds than its record says is refused, nothing written
    cells_before = (tmp_path / CELLS_FILE).read_bytes()
    wrong = {
        "arms": Design(("erm", "resilient"), (0.0, 0.5, "gaussian"), range(4), 50),
        "conditions": Design(("erm", "constrained"), (0.0, 0.9, "gaussian"), range(4), 50),
        "seeds": Design(("erm", "constrained"), (0.0, 0.5, "gaussian"), (1, 0, 2, 3), 50),
        "condition_seeds": Design(
            ("erm", "constrained"), (0.0, 0.5, "gaussian"), range(4), 50, condition_seeds={0.5: (7, 8)}
        ),
    }
    for what, design in wrong.items():
        with pytest.raises(ValueError, match=rf"the run measured {what} .* but was designed with {what} "):
            CellStore(design).save(tmp_path)
        with pytest.raises(ValueError, match="designed with"):
            record_design(tmp_path, design)
    assert (tmp_path / CELLS_FILE).read_bytes() == cells_before
    assert CellStore.load(tmp_path).design == saved


def test_load_store_prefers_the_store_then_the_legacy_reader_then_nothing(tmp_path) -> None:
    store = _store()
    store.save(tmp_path / "new")
    (tmp_path / "design-only").mkdir()
    # the runner wrote the record; the run saved nothing
    record_design(tmp_path / "design-only", store.design)
    calls = []

    def legacy(run_dir):
        calls.append(run_dir.name)
        return store if run_dir.name == "old" else None

    assert set(load_store(tmp_path / "new", legacy)) == set(store) and calls == []
    # a new-style run: its rows pend, legacy is not asked
    empty = load_store(tmp_path / "design-only", legacy)
    assert isinstance(empty, CellStore) and len(empty) == 0 and calls == []
    assert load_store(tmp_path / "old", legacy) is store
    assert load_store(tmp_path / "none", legacy) == {} and load_store(tmp_path / "none") == {}
    assert require_store(store) is store
    with pytest.raises(MissingArrays, match="cell store"):
        require_store({})
