"""The README's feature x path table, kept true: every entry is backed by a test of this suite that pins it down.

EVIDENCE names, for each (feature, path), the test function (and the parameter that selects the path, when the
test is parametrized over paths). This module checks that the README's table has exactly these rows and columns,
no empty entry, that every "error" entry is backed by a test that checks a refusal, and that every named test and
parameter exists; the named tests themselves run in the same suite.
"""
import importlib
import os
import re

import pytest

from conftest import ROOT

COLUMNS = ("three cells", "GradientAccumulation", "TrainAccuStepsCell called directly", "Model_ACCU",
           "Model_ACCU, sink mode", "Accumulator")

_SINK_REFUSES_N = "test_model_accu::test_sink_mode_refuses_n_that_changes"
EVIDENCE = {
    "N, an int": (
        "test_single_device::test_three_micro_steps_walked_through_by_hand",
        "test_driver::test_partial_window_policies",
        "test_accu_cells::test_every_way_of_choosing_the_mode_equals_the_large_batch[automatic]",
        "test_model_accu::test_train_without_sink_equals_large_batch_training",
        "test_model_accu::test_sink_mode_alternates_two_graphs_per_window",
        "test_functional::test_windows_equal_the_large_batch"),
    "N, a schedule `{first_update: N}`": (
        "test_single_device::test_window_equals_one_large_batch_step",
        "test_schedule::test_driver_follows_the_schedule_window_by_window",
        "test_schedule::test_train_accu_steps_cell_follows_the_schedule",
        "test_schedule::test_model_accu_follows_the_schedule_without_sink",
        _SINK_REFUSES_N,
        "test_schedule::test_accumulator_follows_the_schedule"),
    "N, `AdaptiveAccumulation`": (
        "test_single_device::test_window_equals_one_large_batch_step",
        "test_schedule::test_adaptive_driver_changes_n_between_exact_windows",
        "test_schedule::test_adaptive_parallel_cell_called_directly",
        "test_schedule::test_adaptive_model_accu_without_sink",
        _SINK_REFUSES_N,
        "test_schedule::test_adaptive_accumulator_decides_on_the_device_inside_jit"),
    "N, `GoodputAccumulation` (throughput x statistical efficiency)": (
        "test_single_device::test_window_equals_one_large_batch_step",
        "test_lr_engine::test_goodput_policy_calibrates_then_decides_as_the_host_rule",
        "test_schedule::test_goodput_parallel_cell_called_directly",
        "test_goodput_data_parallel::test_every_rank_freezes_the_slowest_devices_constants_and_chooses_the_same_n",
        _SINK_REFUSES_N,
        "test_schedule::test_goodput_accumulator_decides_on_the_device_inside_jit"),
    "learning rate following G (`lr_scaling`), its schedule read at the run's progress": (
        "test_lr_engine::test_each_window_is_the_large_batch_step_at_the_rules_rate[single]",
        "test_lr_engine::test_trainers_apply_the_rule_window_by_window[GradientAccumulation]",
        "test_lr_engine::test_each_window_is_the_large_batch_step_at_the_rules_rate[cell]",
        "test_lr_engine::test_trainers_apply_the_rule_window_by_window[Model_ACCU]",
        "test_lr_engine::test_sink_mode_says_the_rule_has_nothing_to_follow",
        "test_lr_engine::test_each_window_is_the_large_batch_step_at_the_rules_rate[functional]"),
    "weighting by samples or `(loss, num_items)`": (
        "test_weighting::test_token_weighted_window_equals_the_large_batch_token_mean[three_cells]",
        "test_weighting::test_token_weighted_window_equals_the_large_batch_token_mean[driver]",
        "test_weighting::test_token_weighted_window_equals_the_large_batch_token_mean[accu_steps]",
        "test_weighting::test_token_weighted_window_equals_the_large_batch_token_mean[model_accu]",
        "test_weighting::test_sink_mode_weighs_tokens_too",
        "test_functional::test_token_counts_weigh_the_micro_batches"),
    "raw sum `average=False`": (
        "test_paths::test_the_raw_sum_on_every_path[cells]",
        "test_paths::test_the_raw_sum_through_both_trainers[driver]",
        "test_paths::test_the_raw_sum_on_every_path[parallel]",
        "test_paths::test_the_raw_sum_through_both_trainers[model_accu]",
        "test_model_accu::test_sink_mode_carries_the_cells_features[raw_sum]",
        "test_paths::test_the_raw_sum_on_every_path[accumulator]"),
    "partial window: flush, drop, carry": (
        "test_single_device::test_window_equals_one_large_batch_step",
        "test_driver::test_partial_window_policies",
        "test_model_accu::test_drop_discards_the_open_window",
        "test_model_accu::test_partial_window_policies_without_sink",
        "test_model_accu::test_sink_size_must_be_a_multiple_of_the_window",
        "test_functional::test_drop_discards_the_partial_window"),
    "`clip_norm`, once per window": (
        "test_clipping::test_window_gradient_is_clipped_like_the_large_batch_gradient[three_cells]",
        "test_clipping::test_window_gradient_is_clipped_like_the_large_batch_gradient[driver]",
        "test_clipping::test_window_gradient_is_clipped_like_the_large_batch_gradient[accu_steps]",
        "test_clipping::test_window_gradient_is_clipped_like_the_large_batch_gradient[model_accu_loss_scale]",
        "test_model_accu::test_sink_mode_carries_the_cells_features[clip_norm]",
        "test_clipping::test_window_gradient_is_clipped_like_the_large_batch_gradient[accumulator]"),
    "loss scale: update cell, `amp` loss scaler, Tensor": (
        "test_paths::test_every_loss_scale_form_skips_an_overflowing_window_on_every_path[cells]",
        "test_paths::test_the_driver_takes_every_loss_scale_form",
        "test_paths::test_every_loss_scale_form_skips_an_overflowing_window_on_every_path[parallel]",
        "test_telemetry::test_model_accu_records_skipped_windows_and_the_loss_scale",
        "test_model_accu::test_sink_mode_carries_the_cells_features[loss_scale]",
        "test_paths::test_every_loss_scale_form_skips_an_overflowing_window_on_every_path[accumulator]"),
    "`noise_scale`": (
        "test_noise_scale::test_each_window_matches_the_formula_on_per_sample_gradients[cells]",
        "test_noise_scale::test_each_window_matches_the_formula_on_per_sample_gradients[driver]",
        "test_noise_scale::test_each_window_matches_the_formula_on_per_sample_gradients[cell]",
        "test_noise_scale::test_each_window_matches_the_formula_on_per_sample_gradients[model_accu]",
        "test_model_accu::test_sink_mode_carries_the_cells_features[noise_scale]",
        "test_noise_scale::test_each_window_matches_the_formula_on_per_sample_gradients[accumulator]"),
    "mixed precision (amp O1, O2)": (
        "test_mixed_precision::test_mixed_precision_window_equals_the_large_batch[three_cells]",
        "test_mixed_precision::test_mixed_precision_window_equals_the_large_batch[driver]",
        "test_mixed_precision::test_mixed_precision_window_equals_the_large_batch[accu_steps]",
        "test_mixed_precision::test_mixed_precision_window_equals_the_large_batch[model_accu]",
        "test_model_accu::test_sink_mode_carries_the_cells_features[mixed_precision_o2]",
        "test_mixed_precision::test_mixed_precision_window_equals_the_large_batch[accumulator]"),
    "exact resume inside a window": (
        "test_resume::test_a_users_own_loop_resumes_mid_window_with_save_training_state[cells]",
        "test_resume::test_resume_from_any_micro_batch_matches_an_uninterrupted_run",
        "test_resume::test_a_users_own_loop_resumes_mid_window_with_save_training_state[parallel]",
        "test_resume::test_model_accu_resumes_from_any_micro_batch",
        "test_model_accu::test_sink_mode_refuses_exact_state",
        "test_resume::test_a_users_own_loop_resumes_mid_window_with_save_training_state[accumulator]"),
    "a NaN or inf window skipped (`nonfinite`)": (
        "test_nonfinite::test_a_nan_micro_batch_skips_its_window_only_on_every_path[cells]",
        "test_nonfinite::test_a_nan_micro_batch_skips_its_window_only_on_every_path[driver]",
        "test_nonfinite::test_a_nan_micro_batch_skips_its_window_only_on_every_path[parallel]",
        "test_nonfinite::test_a_nan_micro_batch_skips_its_window_only_on_every_path[model_accu]",
        "test_nonfinite::test_sink_mode_skips_a_nan_window_too",
        "test_nonfinite::test_a_nan_micro_batch_skips_its_window_only_on_every_path[accumulator]"),
    "global batch kept on any device count (`global_batch_size`)": (
        "test_elastic::test_a_users_own_loop_keeps_its_global_batch_in_its_state[cells]",
        "test_elastic::test_the_driver_takes_a_global_batch_and_its_state_refuses_another",
        "test_elastic::test_a_users_own_loop_keeps_its_global_batch_in_its_state[parallel]",
        "test_elastic::test_a_state_of_two_devices_resumes_on_one",
        "test_model_accu::test_sink_mode_takes_n_from_the_global_batch",
        "test_elastic::test_a_users_own_loop_keeps_its_global_batch_in_its_state[accumulator]"),
    "sparse embedding gradients (`nn.EmbeddingLookup(sparse=True)`)": (
        "test_sparse::test_three_cells_accumulate_sparse_rows[graph]",
        "test_sparse::test_the_driver_trains_a_sparse_embedding_as_the_dense_large_batch",
        "test_sparse::test_parallel_cells_accumulate_sparse_rows[plain]",
        "test_sparse::test_model_accu_accumulates_sparse_rows[no_sink]",
        "test_sparse::test_model_accu_accumulates_sparse_rows[sink]",
        "test_sparse::test_accumulator_in_a_jit_step_accumulates_sparse_rows[graph]"),
}


def readme_table():
    """{feature: {path: entry}} from the README's "Every feature on every path" table."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as readme:
        text = readme.read()
    section = text.split("## Every feature on every path", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip().replace("`", "") for cell in rows[0].strip("|").split("|")]
    assert header[0] == "feature" and tuple(header[1:]) == COLUMNS, header
    table = {}
    for line in rows[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        table[cells[0]] = dict(zip(COLUMNS, cells[1:]))
    return table


def _parametrized_values(function):
    values = set()
    for mark in getattr(function, "pytestmark", []):
        if mark.name == "parametrize":
            for value in mark.args[1]:
                values.update(str(part) for part in (value if isinstance(value, (tuple, list)) else (value,)))
            values.update(str(i) for i in mark.kwargs.get("ids") or ())
    return values


def test_the_readme_table_has_every_feature_and_path_and_no_empty_entry():
    table = readme_table()
    assert list(table) == list(EVIDENCE), "the README's rows differ from EVIDENCE's"
    for feature, entries in table.items():
        assert tuple(entries) == COLUMNS and all(entries.values()), f"{feature}: an empty entry {entries}"


@pytest.mark.parametrize("feature", list(EVIDENCE))
def test_every_entry_is_backed_by_a_test_of_the_suite(feature):
    entries = readme_table()[feature]
    for path, evidence in zip(COLUMNS, EVIDENCE[feature]):
        match = re.fullmatch(r"(\w+)::(\w+)(?:\[(\w+)\])?", evidence)
        assert match, evidence
        module, name, param = match.groups()
        function = getattr(importlib.import_module(module), name, None)
        assert callable(function), f"{feature} / {path}: {module}.{name} does not exist"
        if param is not None:
            assert param in _parametrized_values(function), f"{feature} / {path}: {evidence} has no [{param}]"
        if entries[path].startswith("error"):
            assert "refuse" in name or "must" in name, f"{feature} / {path}: {name} does not check a refusal"
