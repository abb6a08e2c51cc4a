"""The fault matrix: every fault the system is promised to survive, its outcome, and the tests that inject it.

This list is the one map. ``scripts/reliability_table.py --write`` renders it into docs/reliability.md, and
``tests/faults/test_matrix.py`` checks that every test named here exists, that every fault test of this
package is named here, and that the committed table is the rendering of this list. A test is named by its
pytest node id without parameters (``path::function``); faults injected elsewhere in the suite are named
where they live, not copied here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    """One row: what goes wrong, what the user sees then, and the tests that inject it and check that."""

    fault: str
    outcome: str
    tests: tuple[str, ...]


_F = "tests/faults"

FAULTS: list[Fault] = [
    Fault(
        "SIGKILL at seeded random points of a `fit` run: inside the objective, after the optimizer step, "
        "half-way through the weights file, before the manifest",
        "resume continues from the newest complete checkpoint; final weights equal an uninterrupted run's, "
        "bit for bit; a half-written checkpoint keeps its temporary name and is ignored",
        (
            f"{_F}/test_kill.py::test_a_sigkill_at_a_random_point_resumes_bit_for_bit",
            f"{_F}/test_kill.py::test_the_seeded_points_cover_every_phase_and_differ_by_seed",
        ),
    ),
    Fault(
        "SIGKILL of `descentlab run` after a checkpoint; SIGTERM / Ctrl-C during training",
        '`resume=RUN_DIR` continues, bit for bit; on SIGTERM a checkpoint, `status.json` "interrupted", '
        "exit 130 and the `resume=` command on stderr",
        ("tests/train/test_kill_resume.py::test_stopped_run_resumes_bit_for_bit",),
    ),
    Fault(
        "an exception mid-epoch (in process)",
        "resume from the newest checkpoint equals the uninterrupted run",
        ("tests/train/test_loop_resume.py::test_resume_matches_uninterrupted_run",),
    ),
    Fault(
        "newest checkpoint truncated, corrupt or without manifest",
        "a warning naming the checkpoint and the file; the previous good checkpoint is used and the resumed "
        "run equals the uninterrupted one, bit for bit",
        (
            f"{_F}/test_checkpoint_faults.py::"
            "test_a_damaged_newest_checkpoint_falls_back_with_a_warning_and_resumes_exactly",
            "tests/train/test_checkpoint.py::test_damaged_checkpoint_falls_back",
        ),
    ),
    Fault(
        "the only checkpoint truncated or corrupt, on resume",
        "exit 2, one error line naming the checkpoint and the file (`truncated` / `fails its sha256 "
        "checksum`); never a silent restart",
        (
            f"{_F}/test_checkpoint_faults.py::test_a_resume_onto_a_damaged_only_checkpoint_exits_2_naming_the_file",
            "tests/train/test_checkpoint.py::test_no_good_checkpoint_is_an_error_not_a_silent_restart",
        ),
    ),
    Fault(
        "leftover temporary checkpoint folder",
        "ignored",
        ("tests/train/test_checkpoint.py::test_leftover_temporary_folder_is_ignored",),
    ),
    Fault(
        "full disk (`ENOSPC`) half-way through a checkpoint write",
        "one-line `CheckpointError`: the step, the reason, the free space and the newest complete "
        "checkpoint, which is intact; no half-written folder left; resuming from it is bit for bit",
        (
            f"{_F}/test_checkpoint_faults.py::"
            "test_a_full_disk_mid_checkpoint_is_one_clear_error_and_the_previous_checkpoint_resumes_exactly",
        ),
    ),
    Fault(
        "a file-size limit (`RLIMIT_FSIZE`) hit by the real writers (safetensors, `torch.save`)",
        "the same one-line `CheckpointError` (`File too large`), the previous checkpoint intact, no "
        "temporary folder left; resuming from it is bit for bit",
        (
            f"{_F}/test_checkpoint_faults.py::test_a_file_size_limit_fails_the_real_writers_with_one_clear_error",
        ),
    ),
    Fault(
        "NaN / Inf loss mid-run",
        "the step is skipped and counted; after `train.max_bad_steps` a checkpoint and `NumericalError`",
        ("tests/train/test_loop_resume.py::test_nonfinite_losses_are_skipped_then_stop_the_run",),
    ),
    Fault(
        "NaN / Inf in a batch",
        "`DataError` before any step",
        ("tests/train/test_loop_resume.py::test_bad_batches_and_empty_data_raise_clear_errors",),
    ),
    Fault(
        "NaN gradient reaching `PrimalDual.step()`",
        "`NumericalError` before the inner step; parameters, state and λ untouched",
        (
            "tests/constrained/test_primal_dual_guards.py::test_non_finite_gradient_raises_before_the_inner_step",
        ),
    ),
    Fault(
        "a NaN tensor `lr` set in a HORST param group after construction (NaN guard on or off)",
        "one-line `ConfigError` naming `lr`; weights and optimizer state untouched",
        (
            f"{_F}/test_numerical_faults.py::test_a_nan_tensor_lr_in_a_horst_group_is_one_clear_error_before_any_weight_moves",
        ),
    ),
    Fault(
        "a non-finite float HORST hyper-parameter set after construction",
        "rejected before the weights are touched",
        (
            "tests/optim/test_hyper_validation.py::"
            "test_horst_rejects_a_non_finite_value_set_after_construction_before_touching_the_weights",
        ),
    ),
    Fault(
        "NaN loss on one DDP rank in `fit`",
        "every rank skips the step together (one all-reduced flag), no hang",
        ("tests/distributed/test_fit_skip_ddp.py::test_a_nan_loss_on_one_rank_skips_the_step_on_every_rank",),
    ),
    Fault(
        "non-finite losses on one DDP rank in `fit` past `train.max_bad_steps`",
        "every rank stops with the same `NumericalError`, naming the rank (`on rank(s) [1] of 2`)",
        (f"{_F}/test_ddp_faults.py::test_a_non_finite_loss_on_one_rank_stops_every_rank_naming_it",),
    ),
    Fault(
        "NaN or Inf in the input batch of one DDP rank",
        "every rank stops at that step with a `DataError`: the faulty rank names the field, the others name "
        "the rank (`on rank(s) [1] of 2`); the check costs no host read of its own (it is read with the step's "
        "finiteness flag)",
        (f"{_F}/test_ddp_faults.py::test_a_nan_batch_on_one_rank_stops_every_rank_at_once",),
    ),
    Fault(
        "one DDP rank raises inside `fit`",
        "every rank ends well within the deadline (the peer's all-reduce fails at once on the closed "
        "connection); the launcher names the rank and the rank's traceback the reason",
        (
            f"{_F}/test_ddp_faults.py::test_a_rank_that_raises_in_fit_ends_every_rank_naming_the_rank_and_the_reason",
        ),
    ),
    Fault(
        "non-finite ĝ on one rank of a user's own `PrimalDual` loop (DDP)",
        "every rank raises the same `NumericalError` naming the rank and the layer (one all-reduced flag "
        "vector); a loop that skips the batch stays in step, equal to one process",
        (
            f"{_F}/test_ddp_faults.py::test_a_non_finite_g_hat_on_one_rank_raises_on_every_rank_with_one_message",
        ),
    ),
    Fault(
        "SIGKILL (or SIGTERM) of a run with worker processes",
        "the workers end within 2 s, even inside a step (the kernel's parent-death SIGKILL)",
        (
            f"{_F}/test_workers.py::test_workers_end_within_2_s_of_their_parents_sigkill",
            "tests/train/test_worker_lifetime.py::test_workers_die_with_their_parent_whatever_signal_ends_it",
        ),
    ),
    Fault(
        "a second writer on a run directory",
        "refused, naming the live pid",
        ("tests/train/test_worker_lifetime.py::test_a_run_directory_has_one_writer",),
    ),
    Fault(
        "`--out` unwritable (root included), below a file, or on a pseudo file system",
        "exit 2, one line, no run directory",
        (
            f"{_F}/test_output_faults.py::test_an_existing_unwritable_out_exits_2_with_one_line_even_as_root",
            "tests/test_cli.py::test_an_unwritable_out_exits_2_with_one_line",
            "tests/test_cli.py::test_an_out_below_a_file_exits_2_with_one_line",
            "tests/test_cli.py::test_an_out_folder_that_cannot_be_made_exits_2_with_one_line",
        ),
    ),
    Fault(
        "`--out ''` (empty or blank)",
        "exit 2, one line, nothing written in the current directory",
        ("tests/test_cli.py::test_an_empty_out_exits_2_and_writes_nothing",),
    ),
    Fault(
        "a key typo (command line or `--config` file)",
        'exit 2, one line with "did you mean" and the nearest keys, no run directory',
        ("tests/test_cli.py::test_a_key_typo_on_the_command_line_says_did_you_mean",),
    ),
    Fault(
        "an unreadable, non-YAML or non-mapping `--config` file",
        "exit 2, one line naming the file (and the line of a YAML error)",
        ("tests/test_config_roundtrip.py::test_a_bad_config_file_exits_2_with_one_line",),
    ),
    Fault(
        "an AC/DC schedule too short to end compressed",
        "`ConfigError` naming the minimum `total_steps`",
        ("tests/sparsity/test_acdc.py::test_a_schedule_too_short_to_end_sparse_raises_naming_the_minimum",),
    ),
    Fault(
        "two runs started in the same second",
        "distinct directories",
        ("tests/train/test_rundir.py::test_simultaneous_runs_get_distinct_directories",),
    ),
    Fault(
        "several workers appending curves to one `metrics.csv`",
        "one header, no row lost",
        ("tests/train/test_curves.py::test_concurrent_writers_share_one_header_and_lose_no_row",),
    ),
]


def render(faults: list[Fault] = FAULTS) -> str:
    """The markdown table: fault | outcome | test."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    rows = ["| fault | outcome | test |", "|---|---|---|"]
    for f in faults:
        tests = ", ".join(f"`{t}`" for t in f.tests)
        rows.append(f"| {cell(f.fault)} | {cell(f.outcome)} | {cell(tests)} |")
    return "\n".join(rows)
