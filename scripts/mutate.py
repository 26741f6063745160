"""Mutation testing of the benchmark's measurement core: does some test fail when a number changes?

Each mutant is one small edit to ``imagenet_classification.py`` inside the functions named in
:data:`GROUPS` (the code that computes a number the benchmark reports): a comparison's bound
(``<`` / ``<=``), an arithmetic operator, an integer constant +/- 1, ``round`` / ``floor`` /
``ceil`` / ``int`` and ``min`` / ``max`` swapped, ``and`` / ``or``, a dropped ``not``, a name
replaced by a neighbouring one (``top1`` / ``top5``, ``t_start`` / ``t_warm``, ``width`` /
``height``). Each is written into a temporary copy of the repository, never the working tree,
and that group's tests are run against it, stopping at the first failure: a failure kills the
mutant; a mutant that every test passes survived, and its diff is printed. The issue's hand
edits (:data:`KNOWN_EDITS`) run the same way first.

The ``semantic`` group (issue #25) is hand-written: each mutant in ``scripts/semantic_mutants.py``
is the bug a real mistake would make in a figure or file a user reads (an edit of a short
snippet), run against the tests of its own concern only. A snippet no longer found exactly once
in the module is an ERROR, printed first and last, and the run's exit status is 1.

Usage::

    make mutate                                      # = python scripts/mutate.py
    python scripts/mutate.py --list                  # the mutants, without running anything
    python scripts/mutate.py --only timing shards    # some groups
    python scripts/mutate.py --tests before          # the tests as they were before issue #18
    python scripts/mutate.py --all                   # also the mutants argued equivalent
    python scripts/mutate.py --sample 4              # every 4th mutant of each group: a quicker estimate
    python scripts/mutate.py --only semantic --jobs 1  # the hand-written semantic mutants alone

About 15 minutes on 2 cores. Each worker is a process that imports torch, timm and SPDL once and
forks a child per mutant, which runs pytest in the worker's copy. The report (every mutant, its
status and time, the survivors' diffs) goes to ``build/mutate/report.json``.
"""

from __future__ import annotations

import argparse
import ast
import bisect
import difflib
import io
import json
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tokenize
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = "imagenet_classification.py"
SEMANTIC = "semantic"  # the group of hand-written mutants (scripts/semantic_mutants.py)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_checks import out_file, replacing, run, whole  # noqa: E402
from semantic_mutants import MUTANTS as SEMANTIC_MUTANTS  # noqa: E402


@dataclass(frozen=True)
class Group:
    """Part of the measurement core: the code mutated, by qualified name (``Class`` for all its
    methods, ``Class.method``, a function, or a module-level constant), and the tests run against
    its mutants, fastest first. ``tests_before`` are the tests that exercised it before issue #18
    added tests/test_numbers.py: ``--tests before`` measures the suite as it was."""

    targets: list[str]
    tests: list[str]
    tests_before: list[str]


def _numbers(*names: str) -> list[str]:
    return [f"tests/test_numbers.py::{name}" for name in names]


_RUN_AT_LIMIT = _numbers("test_a_run_at_the_max_bad_limit_reports_exact_figures")
_OLD_CLI_RUN = ["tests/test_cli.py::test_full_run_prints_lines_and_writes_results"]
_OLD_TORCHRUN = ["tests/test_distributed.py::test_torchrun_totals_equal_a_single_process"]

# Update the names when code moves: a name not found stops the run.
GROUPS: dict[str, Group] = {
    "classification": Group(
        ["Classification.forward", "ModelBundle.forward", "ModelBundle.logits"],
        _numbers(
            "test_top1_and_top5_with_labels_at_ranks_1_5_and_6",
            "test_short_batches_are_padded_to_the_compiled_batch_size",
        )
        + [
            "tests/test_model.py::test_classification_counts_equal_direct_topk",
            "tests/test_model.py::test_padding_label_never_counts",
            "tests/test_model.py::test_bundle_counts_match_manual_forward_and_padding_changes_nothing",
            "tests/test_gpu_paths.py::test_a_compiled_model_does_not_recompile_for_a_padded_or_planar_batch",
            "tests/test_hostile17.py::test_images_and_labels_of_the_wrong_kind_are_refused_by_hand",
        ],
        [
            "tests/test_model.py::test_classification_counts_equal_direct_topk",
            "tests/test_model.py::test_padding_label_never_counts",
            "tests/test_model.py::test_bundle_counts_match_manual_forward_and_padding_changes_nothing",
            "tests/test_model.py::test_bf16_bundle_runs_and_counts",
            "tests/test_real_photos.py::test_benchmark_accuracy_on_photos",
            *_OLD_CLI_RUN,
        ],
    ),
    "timing": Group(
        [
            "_TimingWindow",
            "benchmark",
            "_record_batch",
            "_Loop",
            "measure_loader",
            "_measure_model",
            "_Breakdown.from_rates",
        ],  # fmt: skip
        _numbers(
            "test_breakdown_bound_and_efficiency_by_hand",
            "test_fps_window_of_a_run_no_longer_than_the_warmup_covers_it_all",
            "test_failures_fallbacks_and_not_reached_reach_the_summary_and_the_results_file",
            "test_benchmark_defaults_to_the_clis_warmup_and_to_stopping_at_a_bad_image",
            "test_fps_window_leaves_out_a_slow_warmup",
            "test_a_batch_whose_images_all_failed_is_no_warmup_batch",
            "test_timeline_by_hand",
            "test_timeline_covers_the_idle_tail_after_the_last_batch",
            "test_fps_window_ends_with_the_last_batch_not_the_loaders_end_or_a_stop",
            "test_an_image_whose_logits_are_not_finite_is_no_hit_and_is_counted",
            "test_predictions_hold_each_images_top5_classes_and_their_probabilities",
            "test_loader_alone_and_model_alone_are_timed_after_their_warmup",
            "test_fps_of_a_window_the_loader_had_buffered_stays_within_its_stated_bound",
        )
        + [
            "tests/test_accounting.py::test_silently_dropped_batch_is_caught",
            "tests/test_accounting.py::test_a_percentage_of_bad_images_needs_the_number_listed",
            "tests/test_tuning.py::test_sweep_counts_the_images_it_skipped_and_recommends_skip_bad",
            "tests/test_newcomer.py::test_benchmark_says_when_its_warmup_is_in_the_fps",
            "tests/test_newcomer.py::test_predictions_in_list_order_with_class_names",
            "tests/test_page_cache.py::test_the_disk_in_the_verdict_by_hand",
            "tests/test_hostile4.py::test_a_warmup_that_is_no_whole_number_of_batches_is_refused",
            "tests/test_hostile5.py::test_measure_loader_takes_a_device_name_warns_of_an_included_warmup_and_keeps_failures_in_a_list",
            "tests/test_hostile12.py::test_the_predictions_rank_as_the_counts_do_when_probabilities_underflow",
            "tests/test_hostile12.py::test_a_notebook_model_of_another_class_count_is_warned_of_and_its_predictions_kept",
            "tests/test_hostile12.py::test_a_used_up_iterator_is_said_without_a_warm_up_too",
            "tests/test_hostile13.py::test_a_batch_stopped_at_the_warmups_barrier_keeps_its_decoder_counts",
            "tests/test_hostile13.py::test_a_time_out_after_every_listed_image_is_the_loaders_end",
            "tests/test_hostile14.py::test_batches_of_no_tensors_are_type_errors_naming_them",
            "tests/test_hostile14.py::test_numpy_counts_are_taken_and_written_as_json",
            "tests/test_hostile16.py::test_labels_that_name_no_class_of_the_model_are_counted_as_misses_and_warned_of",
            "tests/test_hostile16.py::test_a_batch_that_is_no_pair_is_named_by_its_kind_and_length",
            *(
                f"tests/test_hostile22.py::test_{name}"
                for name in (
                    "bad_images_past_the_listed_are_not_counted_as_failed",
                    "a_window_whose_every_image_failed_is_warned_of_in_a_notebook",
                    "the_loop_s_warnings_name_the_line_that_called_benchmark",
                    "a_notebook_loaders_bad_image_counts_as_failed_and_names_the_policy",
                    "a_notebooks_ctrl_c_as_a_batch_is_counted_stops_after_it_as_that_signal",
                    "a_notebooks_ctrl_c_as_a_whole_run_ends_keeps_the_whole_result",
                    "a_notebooks_ctrl_c_as_a_stopping_run_ends_is_the_stop",
                    "the_image_size_warning_is_given_once_for_a_run",
                    "the_class_count_and_label_warnings_name_the_line_that_called_benchmark",
                    "measure_loader_refuses_one_image_unbatched_whatever_its_labels",
                )
            ),  # fmt: skip
            *_RUN_AT_LIMIT,
        ],
        [
            "tests/test_measurement.py::test_breakdown_verdict_on_cpu_and_gpu",
            "tests/test_accounting.py::test_silently_dropped_batch_is_caught",
            "tests/test_accounting.py::test_get_pipeline_stops_instead_of_dropping",
            *_OLD_CLI_RUN,
            "tests/test_bad_input.py::test_all_bad_list_reports_zero_classified",
            "tests/test_measurement.py::test_breakdown_run_reports_three_rates",
            "tests/test_measurement.py::test_breakdown_of_a_run_shorter_than_the_warmup",
        ],
    ),
    "results": Group(
        [
            "RunResult",
            "_rank_share",
            "_job_total",
            "_reduce_results",
            "_print_summary",
            "_print_breakdown",
            "_print_loader_alone_window",
        ],
        _numbers(
            "test_results_and_their_rates_by_hand",
            "test_summary_of_a_run_without_failures_says_none",
            "test_summary_lists_ten_failures_then_counts_the_rest",
            "test_breakdown_bound_and_efficiency_by_hand",
            "test_failures_fallbacks_and_not_reached_reach_the_summary_and_the_results_file",
            "test_fps_window_of_a_run_no_longer_than_the_warmup_covers_it_all",
            "test_fps_overstatement_bound_by_hand",
            "test_fallback_share_in_the_summary_by_hand",
            "test_reduce_results_keeps_failures_predictions_and_the_lead",
            "test_a_run_at_the_max_bad_limit_reports_exact_figures",
            "test_a_run_states_its_loaders_lead_and_the_bound",
            "test_torchrun_per_rank_figures",
            "test_a_window_opened_at_the_start_is_warned_of_by_hand",
            "test_images_decoded_by_pil_are_said_unless_the_loader_is_pils",
            "test_the_summarys_warnings_by_hand",
        )
        + [
            "tests/test_page_cache.py::test_the_disk_in_the_verdict_by_hand",
            "tests/test_hostile12.py::test_the_dataloaders_images_are_counted_as_pils_without_the_fallback_line",
            "tests/test_hostile13.py::test_a_stopped_jobs_loader_lead_is_that_of_the_ranks_it_times",
            "tests/test_hostile22.py::test_the_jobs_lead_is_each_timed_ranks_lead_summed_within_its_window",
            "tests/test_hostile13.py::test_no_sink_queue_verdict_without_an_image_in_the_fps_window",
            "tests/test_hostile15.py::test_failures_that_are_no_decode_errors_are_type_errors_naming_them",
            "tests/test_hostile15.py::test_a_stopped_jobs_fps_is_over_the_ranks_past_their_warm_up_only",
            "tests/test_hostile16.py::test_the_loader_alones_short_window_is_warned_of_by_hand",
        ],
        [
            *_OLD_CLI_RUN,
            "tests/test_bad_input.py::test_all_bad_list_reports_zero_classified",
            "tests/test_bad_input.py::test_skip_bad_counts_and_lists_every_bad_image",
            "tests/test_cli.py::test_undecodable_file_stops_the_run",
            "tests/test_measurement.py::test_breakdown_run_reports_three_rates",
            *_OLD_TORCHRUN,
        ],
    ),
    "geometry": Group(
        [
            "EvalTransform.from_model",
            "EvalTransform.resize_short",
            "EvalTransform.geometry",
            "EvalTransform.ffmpeg_filter",
            "_crop_start",
            "_resize_region",
            "REGION_TOLERANCE",
        ],  # fmt: skip
        _numbers(
            "test_geometry_matches_timms_transform",
            "test_geometry_refuses_an_empty_image",
            "test_model_config_reaches_the_transform",
            "test_resize_region_stays_in_the_frame_and_samples_where_the_whole_frame_would",
            "test_decoded_pixels_match_timms_transform",
        )
        + [
            "tests/test_decode.py::test_geometry_matches_torchvision",
            "tests/test_hostile12.py::test_the_transform_is_the_test_time_one_timm_validates_with",
            "tests/test_decode.py::test_transform_follows_model_config",
            "tests/test_decode.py::test_resize_region_is_used_for_imagenets_common_sizes",
            "tests/test_decode.py::test_resize_region_samples_where_the_whole_frame_would",
            "tests/test_decode.py::test_region_resize_agrees_with_pil_at_awkward_sizes",
            "tests/test_decode.py::test_cached_filter_graphs_equal_a_fresh_graph_per_image",
            "tests/test_semantic.py::test_pil_decoder_equals_timms_transform",
            "tests/test_semantic.py::test_ffmpeg_decoder_follows_timms_transform_in_each_mode",
            "tests/test_newcomer.py::test_transform_overrides_reach_the_loader_and_the_model",
            "tests/test_newcomer.py::test_a_crop_mode_given_reaches_the_transform",
            "tests/test_hostile14.py::test_transform_values_of_the_wrong_kind_are_refused_not_coerced",
            "tests/test_hostile17.py::test_a_transform_from_a_config_the_loader_cannot_reproduce_is_refused_by_hand",
        ],
        [
            "tests/test_decode.py::test_geometry_matches_torchvision",
            "tests/test_decode.py::test_transform_follows_model_config",
            "tests/test_model.py::test_get_model_reads_pretrained_config",
            "tests/test_decode.py::test_resize_region_is_used_for_imagenets_common_sizes",
            "tests/test_decode.py::test_resize_region_samples_where_the_whole_frame_would",
            "tests/test_decode.py::test_region_resize_agrees_with_pil_at_awkward_sizes",
            "tests/test_decode.py::test_cached_filter_graphs_equal_a_fresh_graph_per_image",
            "tests/test_decode.py::test_pixels_agree_with_pil_on_real_photos",
        ],
    ),
    "shards": Group(
        ["source", "ImageList.shard", "_Shard", "_warmup_for_all_ranks"],
        _numbers("test_shard_sizes_by_hand", "test_each_rank_takes_every_nth_line_from_its_own")
        + ["tests/test_distributed.py::test_shards_cover_every_line_once", *_numbers("test_torchrun_per_rank_figures")]
        + ["tests/test_accounting.py::test_a_rank_outside_the_job_is_refused_not_sliced"],
        ["tests/test_distributed.py::test_shards_cover_every_line_once", "tests/test_source.py", *_OLD_TORCHRUN],
    ),
    "bad-image policy": Group(
        ["_max_bad", "BadImagePolicy", "_decode_items"],
        _numbers(
            "test_max_bad_values_accepted_and_refused",
            "test_bad_image_policy_bookkeeping_by_hand",
            "test_failures_fallbacks_and_not_reached_reach_the_summary_and_the_results_file",
            "test_benchmark_defaults_to_the_clis_warmup_and_to_stopping_at_a_bad_image",
        )
        + [
            "tests/test_decode.py::test_skipping_keeps_batch_mates_and_alignment",
            "tests/test_hostile15.py::test_failures_that_are_no_decode_errors_are_type_errors_naming_them",
            "tests/test_hostile15.py::test_the_policys_ranges_at_their_bounds",
        ]
        + _numbers(
            "test_one_past_the_max_bad_limit_stops_at_the_first_batch",
            "test_exactly_at_the_max_bad_percentage_goes_on",
            "test_a_run_at_the_max_bad_limit_reports_exact_figures",
        ),
        [
            "tests/test_decode.py::test_skipping_keeps_batch_mates_and_alignment",
            "tests/test_bad_input.py::test_max_bad_stops_the_run",
            "tests/test_bad_input.py::test_skip_bad_counts_and_lists_every_bad_image",
            "tests/test_bad_input.py::test_strict_stops_at_first_bad_image",
            "tests/test_bad_input.py::test_all_bad_list_reports_zero_classified",
            "tests/test_measurement.py::test_torch_loader_skips_and_counts_bad_images",
        ],
    ),
    "drain": Group(  # the CPU's batches after the loader's end (added after issue #18: no tests before)
        ["_add_drain", "_print_drain", "_PipelineStats.loader_end"],
        _numbers(
            "test_batches_the_model_ran_after_the_loaders_end_by_hand",
            "test_the_batches_after_a_real_pipelines_end_are_found",
            "test_a_run_states_its_loaders_lead_and_the_bound",
        ),
        [],
    ),
}

# The edits of issue #18's mutation check that no test caught then: (name, group, text, edited text).
KNOWN_EDITS = [
    ("top-k with k=4", "classification", "top = logits.topk(min(5,", "top = logits.topk(min(4,"),
    (
        "top5 rate returns the top-1 rate",
        "results",
        "def top5(self) -> float | None:\n        return self.top5_correct",
        "def top5(self) -> float | None:\n        return self.top1_correct",
    ),
    (
        "FPS window from the start of the run",
        "timing",
        "return self.frames, self.t_last - self.t_warm, False",
        "return self.frames, self.t_last - self.t_start, False",
    ),
    ("--max-bad N compared with >=", "bad-image policy", "len(failures) > limit", "len(failures) >= limit"),
    (
        "--max-bad P% rounded up",
        "bad-image policy",
        "math.floor(Fraction(str(self.max_bad_percent)) * listed / 100)",
        "math.ceil(Fraction(str(self.max_bad_percent)) * listed / 100)",
    ),
    ("shorter side rounded", "geometry", "math.floor(self.size / self.crop_pct)", "round(self.size / self.crop_pct)"),
    ("long side rounded", "geometry", "int(short * height / width)", "round(short * height / width)"),
    (
        "decoder_fallbacks always 0",
        "timing",
        'result.decoder_fallbacks += getattr(batch, "fallbacks", 0)',
        "result.decoder_fallbacks += 0",
    ),
    (
        "FPS bound without the loader's buffer",
        "results",
        "lead / (self.batches_timed - lead)",
        "lead / self.batches_timed",
    ),
]

# Mutants argued to be equivalent: none can change a figure the benchmark reports. Each entry:
# the target, the mutated line as the mutant has it (stripped), and why. They are skipped unless
# --all is given (then every one should survive); an entry that matches no mutant is reported.
_REGION = (
    "another region (or the whole side) is chosen, and still only if its crop samples the source within "
    "REGION_TOLERANCE of where the whole frame's does: a speed choice (tests sweep the bound over sizes)"
)
_GPU = "NOT equivalent: a GPU-only line (CUDA events), which no CPU test can run; a GPU run's timeline would show it"
_CLOCKS = (
    "on the CPU both marks read CLOCK_MONOTONIC (time.monotonic and time.perf_counter on Linux) microseconds "
    "apart at the window's start; on a GPU the mark is a CUDA event and the mutant raises (an error, not a figure)"
)
_LAST = "last = self.t_start + self._since_start(self.marks[-1][0]) if self.marks else self.t_start"  # window end
_PADS_COMMENT = "# every candidate at once: a row per pad, a column per length"


def _ok(a: str = "start >= 0", b: str = "start + src_len <= length", c: str = "<=") -> str:
    """_resize_region's test of its candidates, with one part of it mutated."""
    return f"ok = ({a}) & ({b}) & (np.maximum(np.abs(first), np.abs(last)) {c} REGION_TOLERANCE)"


_PAST_END = (
    "NOT equivalent on a GPU: on the CPU each batch is marked before the window closes, so the bins of the "
    "run's span already hold it; only a GPU's event, timed apart from the host clock, can fall past the end"
)
_FLOOR = "times are never negative: for t >= 0, int(t // i), round(t // i) and int(t / i) are the same bin"
_BOUND = "any count above every shard's batches does: no rank reaches it, every rank times all of its batches"
_FILTER = (
    "it only decides whether to write the crop of a region that is the whole frame (a no-op); dropping a "
    "needed one takes an unscaled image whose sides differ in having a region, and a sweep of 8 common "
    "configs over sizes 16-1100 px found none"
)
_ONE_HELD = (
    "held holds one signal: the command line's handler holds the first and ends the process at a second; a "
    "notebook's holds only SIGINT, so every entry is the same"
)
EQUIVALENT: list[tuple[str, str, str]] = [
    ("_print_drain", "if not drained or (while_loading and result.fps < while_loading * (1 + DRAIN_SLACK)):",
     "differs only when FPS is exactly DRAIN_SLACK above the rate: a float equality no measured pair meets"),
    ("Classification.forward", "top = logits.topk(min(5, logits.shape[-1]), dim=1).indices",
     "logits are N x C: dim 1 is dim -1"),
    ("Classification.forward", "top = logits.topk(min(5, logits.shape[1]), dim=-1).indices",
     "logits are N x C: shape[1] is shape[-1]"),
    ("Classification.forward", "hits = (top == labels.view(n, 1)) & logits.isfinite().all(dim=1, keepdim=True)",
     "logits are N x C: dim 1 is dim -1"),
    ("ModelBundle.logits", "if self.batch_size is not None and 0 <= n < self.batch_size:",
     "only an empty batch differs, padded with rows that are cut off again; benchmark gives the model no empty batch"),
    ("ModelBundle.logits", "if self.batch_size is not None and -1 < n < self.batch_size:",
     "only an empty batch differs, padded with rows that are cut off again; benchmark gives the model no empty batch"),
    ("ModelBundle.logits", "if self.batch_size is not None and 0 < n <= self.batch_size:",
     "a full batch gets 0 rows of padding: the same tensors"),
    ("EvalTransform.geometry", "elif width < height:", "only a square image differs, and both branches give S x S"),
    ("EvalTransform.ffmpeg_filter",
     'region = "" if (new_w, src_h) == (width, height) else f"crop={src_w}:{src_h}:{x0}:{y0}:exact=1,"', _FILTER),
    ("EvalTransform.ffmpeg_filter",
     'region = "" if (out_w, src_h) == (width, height) else f"crop={src_w}:{src_h}:{x0}:{y0}:exact=1,"', _FILTER),
    ("EvalTransform.ffmpeg_filter",
     'region = "" if (src_h, src_h) == (width, height) else f"crop={src_w}:{src_h}:{x0}:{y0}:exact=1,"',
     "true only for a square image, whose sides have the same region: the same test"),
    ("EvalTransform.ffmpeg_filter",
     'region = "" if (src_w, new_h) == (width, height) else f"crop={src_w}:{src_h}:{x0}:{y0}:exact=1,"', _FILTER),
    ("EvalTransform.ffmpeg_filter",
     'region = "" if (src_w, out_h) == (width, height) else f"crop={src_w}:{src_h}:{x0}:{y0}:exact=1,"', _FILTER),
    ("EvalTransform.ffmpeg_filter",
     'region = "" if (src_w, src_w) == (width, height) else f"crop={src_w}:{src_h}:{x0}:{y0}:exact=1,"',
     "true only for a square image, whose sides have the same region: the same test"),
    ("_resize_region", "if ratio <= 1:", "a side that is not scaled is resized whole: the same samples, more work"),
    ("_resize_region", "pads = np.arange(4, 18)[:, None]  " + _PADS_COMMENT, _REGION),
    ("_resize_region", "pads = np.arange(4, 16)[:, None]  " + _PADS_COMMENT, _REGION),
    ("_resize_region", "out = crop + pads + 5 + np.arange(36)", _REGION),
    ("_resize_region", "out = crop + pads + 4 + np.arange(37)", _REGION),
    ("_resize_region", "out = crop + pads + 4 + np.arange(35)", _REGION),
    ("_resize_region", "last = first + (crop + 1) * (step - ratio)",
     "the error is linear in k: bounded at k = 0 and k = crop + 1, it is bounded at crop - 1. " + _REGION),
    ("_resize_region", "last = first + (crop - 0) * (step - ratio)",
     "the error is linear in k: bounded at k = 0 and k = crop, it is bounded at crop - 1. " + _REGION),
    ("_resize_region", _ok(c="<"), _REGION),
    ("_resize_region", _ok(a="start > 0"), _REGION),
    ("_resize_region", _ok(b="start + src_len < length"), _REGION),
    ("_resize_region", _ok(a="start >= 1"), _REGION),
    ("_resize_region", _ok(a="start >= -1"), "start is even: the same test as start >= 0"),
    ("_resize_region", _ok(a="ideal_start >= 0"),
     "ideal_start >= 0 implies start >= 0 (start is it rounded to even): only fewer regions. " + _REGION),
    ("_resize_region", _ok(b="ideal_start + src_len <= length"),
     "start is within REGION_TOLERANCE of ideal_start and start, src_len, length are integers: a region past "
     "the frame's end still fails, only fewer regions pass. " + _REGION),
    ("_record_batch",
     'for name, value in zip(("images", "labels"), batch, strict=False):  # not an AttributeError mid-loop',
     "the line above refused a batch that is not two long: strict has nothing to check"),
    ("ImageList.shard", "if not (_whole(world_size, 0) and _whole(rank, 0) and rank < world_size):",
     "a rank of 0 or more below world_size makes world_size 1 or more: the same test"),
    ("_job_total", 'job.warmup_included = timed[-1]["warmup_included"]',
     "the ranks in timed are all past the warm-up, or (none is) all the ranks, none past it: one value"),
    ("_Loop", "finite = logits.isfinite().all(dim=1)", "logits are N x C: their last dimension is dimension 1"),
    ("_Loop", 'labels = labels.to(logits.device, non_blocking=labels.device.type != "cpu")  # a DataLoader\'s',
     "non_blocking only decides whether the copy waits: the labels' values are the same either way"),
    ("benchmark", "if held and sys.exc_info()[2] is not None:  # the run was stopping: the signal stops it, as ever",
     "sys.exc_info() is three Nones or three values: its traceback is None exactly when its exception is"),
    ("benchmark", "if held and sys.exc_info()[0] is not None:  # the run was stopping: the signal stops it, as ever",
     "sys.exc_info() is three Nones or three values: its type is None exactly when its exception is"),
    ("benchmark", "raise RunInterrupted(held[-1])", _ONE_HELD),
    ("benchmark", "raise RunInterrupted(held[-1], loop.result)", _ONE_HELD),
    ("_Loop", "if first and tuple(images.shape[2:]) != (size, size):",
     "images are N x 3 x H x W (_record_batch checked a batch with images): shape[2:] is shape[-2:]"),
    ("_Loop", "self.classes = logits.shape[1]", "logits are N x C: shape[1] is shape[-1]"),
    ("_Loop", "if first and logits.shape[1] != NUM_CLASSES:  # a notebook's own model: get_model refuses one",
     "logits are N x C: shape[1] is shape[-1]"),
    ("_Loop", "raise RunInterrupted(held[-1])", _ONE_HELD),
    ("measure_loader", "window.add(batch[1].shape[0])", "a batch's labels (N x 1) have a row per image"),
    ("measure_loader", "window.add(batch[-1].shape[0])", "a batch's labels (N x 1) have a row per image"),
    ("_TimingWindow", "event = torch.cuda.Event(enable_timing=False)", _GPU),
    ("_TimingWindow", "return self._start_mark.elapsed_time(mark) * 1e3", _GPU),
    ("_TimingWindow", "return self._start_mark.elapsed_time(mark) / 1001.0", _GPU),
    ("_TimingWindow", "return self._mark.elapsed_time(mark) / 1e3", _GPU),
    ("_TimingWindow", "return self.t_start.elapsed_time(mark) / 1e3", _GPU),
    ("_TimingWindow", "return self._since_start.elapsed_time(mark) / 1e3", _GPU),
    ("_TimingWindow", "return mark - self.t_start", _CLOCKS),
    ("_TimingWindow", "return self.frames_all, self.t_last - self._start_mark, True", _CLOCKS),
    ("_TimingWindow", _LAST.replace("else self.t_start", "else self.t_warm"),
     "with no batch the warm-up never ended: t_warm is still t_start"),
    ("_TimingWindow", _LAST.replace("last = self.t_start", "last = self._start_mark"), _CLOCKS),
    ("_TimingWindow", _LAST.replace("else self.t_start", "else self._start_mark"), _CLOCKS),
    ("_TimingWindow", '"end_s": self.t_end - self._start_mark,', _CLOCKS),
    ("_TimingWindow", "last = round(max(times, default=0.0) // interval) + 1", _FLOOR),
    ("_TimingWindow", "last = int(max(times, default=0.0) / interval) + 1", _FLOOR),
    ("_TimingWindow", "last = int(max(times, default=0.0) // interval) + 0", _PAST_END),
    ("_TimingWindow", "last = int(max(times, default=0.0) // interval) - 1", _PAST_END),
    ("_TimingWindow", "last = int(min(times, default=0.0) // interval) + 1", _PAST_END),
    ("_TimingWindow", "images = [0] * max(_bin_count(self.t_end - self._start_mark, interval), last)", _CLOCKS),
    ("_TimingWindow", "images[round(t // interval)] += frames", _FLOOR),
    ("_TimingWindow", "images[int(t / interval)] += frames", _FLOOR),
    ("_TimingWindow", "for t, frames in zip(times, counts, strict=False):",
     "both come from self.marks: always the same length"),
    ("_TimingWindow", '"batch_end_s": [round(t, 7) for t in times],',
     "the batch ends are kept to the microsecond; 10 us more or less is far below what a batch's end means"),
    ("_TimingWindow", '"batch_end_s": [round(t, 5) for t in times],',
     "the batch ends are kept to the microsecond; 10 us more or less is far below what a batch's end means"),
    ("_Loop", "classes = logits.topk(min(5, logits.shape[-1]), dim=1).indices", "logits are N x C: dim 1 is dim -1"),
    ("_Loop", "classes = logits.topk(min(5, logits.shape[1]), dim=-1).indices",
     "logits are N x C: shape[1] is shape[-1]"),
    ("_Loop", "probs = logits.softmax(dim=1).gather(-1, classes)", "logits are N x C: dim 1 is dim -1"),
    ("_Loop", "probs = logits.softmax(dim=-1).gather(1, classes)", "logits are N x C: dim 1 is dim -1"),
    ("EvalTransform.from_model",
     'return cls(int(height), float(cfg["crop_pct"]), str(cfg["interpolation"]), mean, std, cfg["crop_mode"])',
     "a transform that is not square is refused just above: height is width"),
    ("EvalTransform.from_model",
     'config = {"input_size": (4, t.size, t.size)} | asdict(t)',
     "only the last two sizes of input_size are read, not its channels"),
    ("EvalTransform.from_model",
     'config = {"input_size": (2, t.size, t.size)} | asdict(t)',
     "only the last two sizes of input_size are read, not its channels"),
    ("EvalTransform.from_model",
     "short = math.floor(height / crop_pct)  # checked here too, to name the flag that sets it",
     "a transform that is not square is refused just above: height is width"),
    ("EvalTransform.from_model", "if short * short >= MAX_IMAGE_PIXELS:",
     "MAX_IMAGE_PIXELS is no square number: short * short never equals it"),
    ("RunResult", "predictions: list[dict] | None = field(default=None, repr=True)",
     "repr only: no figure, and the results file leaves predictions out"),
    ("_Breakdown.from_rates", 'bottleneck = "loader" if loader_fps <= model_fps else "model"',
     "only a tie of two measured rates differs, where neither side is the bottleneck"),
    ("measure_loader", "return frames / seconds if seconds >= 0 else 0.0",
     "seconds is never 0 or less: two reads of a monotonic nanosecond clock around the loop"),
    ("measure_loader", "return frames / seconds if seconds > 0 else 1.0",
     "seconds is never 0 or less: two reads of a monotonic nanosecond clock around the loop"),
    ("measure_loader", "return frames / seconds if seconds > -1 else 0.0",
     "seconds is never 0 or less: two reads of a monotonic nanosecond clock around the loop"),
    ("_measure_model", "images = torch.randint(1, 256, (batch_size, size, size, 3), dtype=torch.uint8, device=device)",
     "the pixel values of the synthetic images do not change the model's speed"),
    ("_measure_model", "images = torch.randint(0, 255, (batch_size, size, size, 3), dtype=torch.uint8, device=device)",
     "the pixel values of the synthetic images do not change the model's speed"),
    ("_warmup_for_all_ranks", "most = math.ceil(shard.size_of(listed, 0) * batch_size)", _BOUND),
    ("_warmup_for_all_ranks", "most = math.ceil(shard.size_of(listed, -1) / batch_size)",
     "'rank -1' has rank 0's lines or one more: " + _BOUND),
    ("_warmup_for_all_ranks", "return warmup_batches if fewest > warmup_batches else most + 2", _BOUND),
    ("EvalTransform.ffmpeg_filter", "if min(new_w, new_h) <= self.size:  # crop_pct > 1: the crop is padded with "
     "black, as torchvision pads it",
     "a side resized to exactly the crop's length takes the padded branch: the whole frame resized, cropped, padded "
     "by 0: the pixels of the region path within REGION_TOLERANCE (a speed choice)"),
    ("_crop_start", "return round((length - crop) / 2) if length > crop else -((crop - length) // 2)",
     "a side of exactly the crop's length starts at 0 either way"),
]  # fmt: skip

_COMPARE = {"<": ["<="], "<=": ["<"], ">": [">="], ">=": [">"], "==": ["!="], "!=": ["=="],
            "in": ["not in"], "not in": ["in"], "is": ["is not"], "is not": ["is"]}  # fmt: skip
_ARITHMETIC = {"+": "-", "-": "+", "*": "/", "/": "*", "//": "/", "%": "//"}
_CALLS = {"math.floor": ["round", "math.ceil"], "math.ceil": ["math.floor"], "round": ["math.floor", "math.ceil"],
          "int": ["round"], "min": ["max"], "max": ["min"]}  # fmt: skip
# Names that are each other's neighbours though they do not look alike.
_NEIGHBOURS = [{"width", "height"}, {"left", "top"}, {"listed", "classified", "failed"}, {"rank", "world_size"}]


@dataclass
class Mutant:
    id: int
    group: str
    target: str
    line: int
    description: str
    source: str
    status: str = "pending"  # killed | survived | timeout | error | equivalent (not run)
    seconds: float = 0.0
    diff: str = ""
    tests: list[str] | None = None  # a semantic mutant's own tests (else its group's)


################################################################################
# Mutants
################################################################################


class _Source:
    """The module's text with byte offsets for AST positions and its tokens in order."""

    def __init__(self, text: str) -> None:
        self.text, self.data = text, text.encode()
        self.lines = text.splitlines(keepends=True)
        self.line_starts = [0]
        for line in self.lines:
            self.line_starts.append(self.line_starts[-1] + len(line.encode()))
        self.tokens = []  # (byte offset, byte end, string)
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.OP, tokenize.NAME):
                self.tokens.append((self.offset(*tok.start, chars=True), self.offset(*tok.end, chars=True), tok.string))
        self.token_starts = [t[0] for t in self.tokens]

    def offset(self, line: int, col: int, chars: bool = False) -> int:
        """Byte offset of a (1-based line, column); the column counts bytes unless ``chars``."""
        if chars:
            col = len(self.lines[line - 1][:col].encode())
        return self.line_starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def tokens_between(self, start: int, end: int) -> list[tuple[int, int, str]]:
        i = bisect.bisect_left(self.token_starts, start)
        return [t for t in self.tokens[i:] if t[0] < end]

    def segment(self, start: int, end: int) -> str:
        return self.data[start:end].decode()


def _targets(tree: ast.Module) -> dict[str, ast.AST]:
    """Qualified name -> node for every function, class, method and module-level constant."""
    found: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            found[node.name] = node
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    found[f"{node.name}.{item.name}"] = item
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = node
    return found


def _skipped(node: ast.AST) -> list[ast.AST]:
    """Subtrees not to mutate: docstrings, annotations, decorators and f-strings."""
    skip: list[ast.AST] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.FunctionDef | ast.ClassDef):
            skip += sub.decorator_list
            body = sub.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.append(body[0])
        if isinstance(sub, ast.FunctionDef):
            skip += [a.annotation for a in (*sub.args.args, *sub.args.kwonlyargs) if a.annotation]
            skip += [sub.returns] if sub.returns else []
        if isinstance(sub, ast.AnnAssign):
            skip.append(sub.annotation)
        if isinstance(sub, ast.JoinedStr):
            skip.append(sub)
    return skip


def _similar(a: str, b: str) -> bool:
    """Whether ``b`` is a plausible slip for ``a``: one character apart, a shared word, or a known pair."""
    if a == b:
        return False
    if len(a) == len(b) and sum(x != y for x, y in zip(a, b, strict=True)) == 1:
        return True
    if "_" in a + b and set(a.split("_")) & set(b.split("_")):
        return True
    return any(a in pair and b in pair for pair in _NEIGHBOURS)


def _scope_names(scope: ast.AST, cls: ast.ClassDef | None) -> tuple[set[str], dict[str, set[str]]]:
    """The local names of a function (arguments and assigned names) and, per object, the attributes
    read or written on it; for ``self``, those of the whole class, dataclass fields included."""
    local: set[str] = set()
    attrs: dict[str, set[str]] = {}
    for sub in ast.walk(scope):
        if isinstance(sub, ast.arg):
            local.add(sub.arg)
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            local.add(sub.id)
        elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
            attrs.setdefault(sub.value.id, set()).add(sub.attr)
    if cls is not None:
        for sub in ast.walk(cls):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                attrs.setdefault("self", set()).add(sub.attr)
            if isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                attrs.setdefault("self", set()).add(sub.target.id)
    return local, attrs


def _value_nodes(scope: ast.AST) -> set[int]:
    """The nodes inside what a function returns or assigns: where a neighbouring name is swapped in."""
    values = set()
    for sub in ast.walk(scope):
        if isinstance(sub, ast.Return | ast.Assign | ast.AugAssign | ast.AnnAssign) and sub.value is not None:
            values |= {id(n) for n in ast.walk(sub.value)}
    return values


def _operator_token(src: _Source, start: int, end: int, choices) -> tuple[int, int, str] | None:
    """The operator token (two for ``not in`` / ``is not``) between two operands' spans."""
    tokens = [t for t in src.tokens_between(start, end) if t[2] not in "()"]
    if len(tokens) == 2 and f"{tokens[0][2]} {tokens[1][2]}" in choices:
        return tokens[0][0], tokens[1][1], f"{tokens[0][2]} {tokens[1][2]}"
    if len(tokens) == 1 and tokens[0][2] in choices:
        return tokens[0]
    return None


def _node_mutations(src: _Source, node: ast.AST, local: set[str], attrs: dict[str, set[str]]):
    """Yield ``(start, end, replacement, description)`` for one AST node."""
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        for left, right in zip(operands, operands[1:], strict=False):
            if tok := _operator_token(src, src.span(left)[1], src.span(right)[0], _COMPARE):
                for new in _COMPARE[tok[2]]:
                    yield tok[0], tok[1], new, f"`{tok[2]}` -> `{new}`"
    elif isinstance(node, ast.BinOp | ast.AugAssign):
        left, right = (node.left, node.right) if isinstance(node, ast.BinOp) else (node.target, node.value)
        suffix = "=" if isinstance(node, ast.AugAssign) else ""
        choices = {k + suffix: v + suffix for k, v in _ARITHMETIC.items()}
        if isinstance(left, ast.Constant) and isinstance(left.value, str):
            return  # string formatting or concatenation
        if tok := _operator_token(src, src.span(left)[1], src.span(right)[0], choices):
            yield tok[0], tok[1], choices[tok[2]], f"`{tok[2]}` -> `{choices[tok[2]]}`"
    elif isinstance(node, ast.BoolOp):
        for left, right in zip(node.values, node.values[1:], strict=False):
            if tok := _operator_token(src, src.span(left)[1], src.span(right)[0], {"and", "or"}):
                new = "or" if tok[2] == "and" else "and"
                yield tok[0], tok[1], new, f"`{tok[2]}` -> `{new}`"
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not | ast.USub):
        start, end = src.span(node)
        operand = src.span(node.operand)[0]
        yield start, operand, "", f"`{src.segment(start, operand).strip()}` dropped"
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
        start, end = src.span(node)
        if isinstance(node.value, bool):
            news = [str(not node.value)]
        elif isinstance(node.value, int):
            news = [repr(node.value + 1), repr(node.value - 1)]
        else:
            news = [repr(node.value + 1)]
        for new in news:
            yield start, end, new, f"`{src.segment(start, end)}` -> `{new}`"
    elif isinstance(node, ast.Call):
        yield from _call_mutations(src, node)
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in local:
        start, end = src.span(node)
        for other in sorted(n for n in local if _similar(node.id, n)):
            yield start, end, other, f"`{node.id}` -> `{other}`"
    elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name):
        start, end = src.span(node)
        base = node.value.id
        for other in sorted(a for a in attrs.get(base, ()) if _similar(node.attr, a)):
            yield start, end, f"{base}.{other}", f"`{base}.{node.attr}` -> `{base}.{other}`"


def _call_mutations(src: _Source, node: ast.Call):
    name = ast.unparse(node.func)
    if name not in _CALLS:
        return
    # int() of a plain value is equivalent to round(); only int() of arithmetic truncates.
    if name == "int" and not (len(node.args) == 1 and isinstance(node.args[0], ast.BinOp)):
        return
    start, end = src.span(node.func)
    for new in _CALLS[name]:
        yield start, end, new, f"`{name}(...)` -> `{new}(...)`"


def generate(text: str, groups: dict[str, Group]) -> list[Mutant]:
    """Every mutant of the named targets, in source order; each one parses and differs from the rest."""
    src = _Source(text)
    tree = ast.parse(text)
    targets = _targets(tree)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    mutants: list[Mutant] = []
    seen: set[str] = {text}
    for group, spec in groups.items():
        for name in spec.targets:
            if name not in targets:
                raise SystemExit(f"mutate: {name!r} (group {group}) is not in {MODULE}: update GROUPS")
            node = targets[name]
            skip = {id(n) for s in _skipped(node) for n in ast.walk(s)}
            scopes = node.body if isinstance(node, ast.ClassDef) else [node]  # a class: each method alone
            cls = classes.get(name.split(".")[0])
            for scope in scopes:
                local, attrs = _scope_names(scope, cls)
                values = _value_nodes(scope)
                for sub in ast.walk(scope):
                    if id(sub) in skip or (isinstance(sub, ast.Name | ast.Attribute) and id(sub) not in values):
                        continue
                    for start, end, new, description in _node_mutations(src, sub, local, attrs):
                        mutated = (src.data[:start] + new.encode() + src.data[end:]).decode()
                        if mutated in seen or not _parses(mutated):
                            continue
                        seen.add(mutated)
                        line = src.data[:start].count(b"\n") + 1
                        mutants.append(Mutant(len(mutants) + 1, group, name, line, description, mutated))
    return sorted(mutants, key=lambda m: (list(groups).index(m.group), m.line, m.id))


def mark_equivalent(mutants: list[Mutant], original: str) -> list[tuple[str, str, str]]:
    """Mark the mutants that :data:`EQUIVALENT` argues for; return the entries that matched none."""
    unmatched = []
    for target, mutated_line, reason in EQUIVALENT:
        matched = [m for m in mutants if (m.target, _line(m)) == (target, mutated_line)]
        for m in matched:
            m.status, m.diff = "equivalent", f"{reason}\n{_diff(original, m.source)}"
        if not matched:
            unmatched.append((target, mutated_line, reason))
    return unmatched


def _line(mutant: Mutant) -> str:
    """The mutated line, stripped."""
    return mutant.source.splitlines()[mutant.line - 1].strip()


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True


def known_edits(text: str) -> list[Mutant]:
    """The issue's hand edits as mutants; one that no longer applies is reported as an error."""
    edits = []
    for i, (name, group, old, new) in enumerate(KNOWN_EDITS, start=1):
        mutant = Mutant(-i, group, "known edit", 0, name, text.replace(old, new))
        if text.count(old) != 1:
            mutant.status, mutant.source = "error", text
            mutant.diff = f"the text {old!r} is found {text.count(old)} times in {MODULE}: update KNOWN_EDITS"
        else:
            mutant.line = text[: text.index(old)].count("\n") + 1
        edits.append(mutant)
    return edits


def semantic_mutants(text: str, run_equivalent: bool = False) -> list[Mutant]:
    """The hand-written semantic mutants; one whose snippet is not found exactly once is an error."""
    mutants = []
    for i, m in enumerate(SEMANTIC_MUTANTS, start=1):
        mutant = Mutant(1000 + i, SEMANTIC, "semantic", 0, m.name, text.replace(m.old, m.new), tests=list(m.tests))
        if (count := text.count(m.old)) != 1:
            mutant.status, mutant.source = "error", text
            mutant.diff = (f"ANCHOR LOST: the snippet {m.old!r} is found {count} times in {MODULE}: "
                           "re-anchor it in scripts/semantic_mutants.py")  # fmt: skip
        else:
            mutant.line = text[: text.index(m.old)].count("\n") + 1
            if m.equivalent and not run_equivalent:
                mutant.status, mutant.diff = "equivalent", f"{m.equivalent}\n{_diff(text, mutant.source)}"
        mutants.append(mutant)
    return mutants


################################################################################
# Running them
################################################################################

# The worker: a process that imports the heavy libraries once, then for each request forks a
# child that runs pytest in the given copy, and answers with the exit status.
_SERVER = r"""
import json, os, signal, sys, time
import numpy, PIL.Image, torch, torchvision, timm, timm.data, spdl.io, spdl.pipeline, hypothesis, pytest
pid = 0

def stop(signum, frame):  # the parent gave up: end the running child and its subprocesses
    if pid:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:  # ended already
            pass
    os._exit(1)

signal.signal(signal.SIGTERM, stop)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.setpgid(0, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1), os.dup2(log, 2)
        os.chdir(request["cwd"])
        sys.path.insert(0, request["cwd"])
        os._exit(int(pytest.main(request["args"])))
    deadline = started + request["timeout"]
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        code = None
    else:
        code = os.waitstatus_to_exitcode(done[1])
    print(json.dumps({"code": code, "seconds": time.monotonic() - started}), flush=True)
"""


class Worker:
    """A copy of the repository and a forking pytest server that runs tests in it."""

    def __init__(self, index: int, workdir: Path) -> None:
        self.copy = workdir / f"worker{index}"
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                               capture_output=True).stdout.decode().split("\0")  # fmt: skip
        for rel in filter(None, files):
            if (ROOT / rel).is_file():
                (self.copy / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, self.copy / rel)
        self.log = workdir / f"worker{index}.log"
        self.basetemp = workdir / f"worker{index}-tmp"
        self.server = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       text=True, cwd=self.copy)  # fmt: skip
        assert json.loads(self.server.stdout.readline())["ready"]

    def run(self, source: str, tests: list[str], timeout: float) -> tuple[str, float]:
        """Run ``tests`` against this module source; ``(killed | survived | timeout | error, seconds)``."""
        (self.copy / MODULE).write_text(source)
        # A mutant of the same size written within the same second would pass Python's check of
        # the cached bytecode: drop it. The tests' bytecode, which never changes, stays cached.
        for cached in (self.copy / "__pycache__").glob(f"{Path(MODULE).stem}.*.pyc"):
            cached.unlink()
        args = ["-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-W", "ignore::pytest.PytestWarning",
                f"--basetemp={self.basetemp}", *tests]  # fmt: skip
        request = {"cwd": str(self.copy), "args": args, "timeout": timeout, "log": str(self.log)}
        self.server.stdin.write(json.dumps(request) + "\n")
        self.server.stdin.flush()
        answer = json.loads(self.server.stdout.readline())
        status = {None: "timeout", 0: "survived", 1: "killed"}.get(answer["code"], "error")
        return status, answer["seconds"]

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def close(self, abort: bool = False) -> None:
        """Stop the server; with ``abort``, kill the test run in progress too."""
        if abort:
            self.server.terminate()
        else:
            self.server.stdin.close()
        self.server.wait(timeout=30)


def _semantic_tests(tests: list[str], suite: str) -> list[str]:
    """A semantic mutant's tests; ``before``: without tests/test_semantic.py, which issue #25 added."""
    return [t for t in tests if suite != "before" or not t.startswith("tests/test_semantic.py")]


def _selection(group: str, suite: str) -> list[str]:
    if group == SEMANTIC:  # every semantic mutant's tests, once, for the baseline
        return _semantic_tests(list(dict.fromkeys(t for m in SEMANTIC_MUTANTS for t in m.tests)), suite)
    return GROUPS[group].tests_before if suite == "before" else GROUPS[group].tests


def run_all(mutants: list[Mutant], original: str, workers: list[Worker], suite: str) -> dict[str, float]:
    """Check each group's tests pass unmutated, then run every mutant; returns baseline seconds."""
    groups = sorted({m.group for m in mutants if m.status == "pending"}, key=[*GROUPS, SEMANTIC].index)
    baseline: dict[str, float] = {}
    jobs: queue.Queue = queue.Queue()
    for group in groups:
        jobs.put(("baseline", group))
    _drain(jobs, workers, lambda w, job: _baseline(w, job[1], original, suite, baseline))
    total, done = len(mutants), [0]
    for mutant in mutants:
        if mutant.status == "pending":
            jobs.put(("mutant", mutant))
    lock = threading.Lock()

    def run_one(worker: Worker, job) -> None:
        mutant = job[1]
        timeout = 2 * baseline[mutant.group] + 60
        tests = _semantic_tests(mutant.tests, suite) if mutant.tests else _selection(mutant.group, suite)
        if tests:
            mutant.status, mutant.seconds = worker.run(mutant.source, tests, timeout)
        else:  # no test of its concern (--tests before)
            mutant.status = "survived"
        if mutant.status == "error":
            mutant.diff = worker.log_tail()
        elif mutant.status == "survived":
            mutant.diff = _diff(original, mutant.source)
        with lock:
            done[0] += 1
            print(f"[{done[0]}/{total}] {mutant.status:8} {mutant.group:16} {mutant.target} line {mutant.line}: "
                  f"{mutant.description} ({mutant.seconds:.1f} s)", flush=True)  # fmt: skip

    _drain(jobs, workers, run_one)
    return baseline


def _baseline(worker: Worker, group: str, original: str, suite: str, baseline: dict[str, float]) -> None:
    status, seconds = worker.run(original, _selection(group, suite), timeout=900)
    print(f"baseline {group}: {status} in {seconds:.1f} s", flush=True)
    if status != "survived":
        print(worker.log_tail(), file=sys.stderr)
        raise SystemExit(f"mutate: the tests of group {group} fail on the unmutated module")
    baseline[group] = seconds


def _drain(jobs: queue.Queue, workers: list[Worker], handle) -> None:
    """Hand the queued jobs to the workers, one thread per worker; re-raise a thread's exit."""
    errors: list[BaseException] = []

    def loop(worker: Worker) -> None:
        while not errors:
            try:
                job = jobs.get_nowait()
            except queue.Empty:
                return
            try:
                handle(worker, job)
            except BaseException as e:  # noqa: BLE001  (re-raised in the main thread below)
                errors.append(e)

    threads = [threading.Thread(target=loop, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _diff(original: str, mutated: str) -> str:
    lines = difflib.unified_diff(original.splitlines(), mutated.splitlines(), MODULE, MODULE, n=1, lineterm="")
    return "\n".join(lines)


################################################################################
# Report
################################################################################


_STATUSES = ("killed", "timeout", "survived", "equivalent", "error")


def summarise(mutants: list[Mutant], edits: list[Mutant]) -> dict:
    """Counts per group and the score: killed (timeouts included) over the mutants not argued equivalent."""
    per_group = {}
    for group in GROUPS:
        mine = [m for m in mutants if m.group == group]
        if mine:
            per_group[group] = {s: sum(m.status == s for m in mine) for s in _STATUSES}
    detected = sum(m.status in ("killed", "timeout") for m in mutants)
    counted = sum(m.status != "equivalent" for m in mutants)
    return {
        "mutants": len(mutants),
        "killed": detected,
        "survived": sum(m.status == "survived" for m in mutants),
        "equivalent": len(mutants) - counted,
        "errors": sum(m.status == "error" for m in mutants),
        "score": detected / counted if counted else 0.0,
        "groups": per_group,
        "known_edits_caught": sum(e.status in ("killed", "timeout") for e in edits),
        "known_edits": len(edits),
    }


def summarise_semantic(semantic: list[Mutant]) -> dict:
    """The semantic group's counts and score (killed over those run)."""
    counts = {s: sum(m.status == s for m in semantic) for s in _STATUSES}
    run = counts["killed"] + counts["timeout"] + counts["survived"]
    detected = counts["killed"] + counts["timeout"]
    return {"mutants": len(semantic), **counts, "score": detected / run if run else 0.0}


def print_semantic(summary: dict, semantic: list[Mutant]) -> None:
    print("\nSemantic mutants (scripts/semantic_mutants.py):")
    for m in semantic:
        print(f"  {m.status:10} {m.description}")
    for m in semantic:
        if m.status in ("survived", "error"):
            print(f"\n{m.status.upper()} semantic line {m.line}: {m.description}\n{m.diff}")
    print(f"\nSemantic score: {summary['killed'] + summary['timeout']}/"
          f"{summary['killed'] + summary['timeout'] + summary['survived']} killed ({summary['score']:.1%}), "
          f"{summary['survived']} survived, {summary['equivalent']} argued equivalent (not run), "
          f"{summary['error']} ERRORS (snippets to re-anchor)")  # fmt: skip


def _print_report(summary: dict, mutants: list[Mutant], edits: list[Mutant], seconds: float) -> None:
    print("\nThe issue's hand edits:")
    for e in edits:
        print(f"  {e.status:8} {e.description}" + (f": {e.diff}" if e.status == "error" else ""))
    print(f"\nBy group ({' / '.join(_STATUSES)}):")
    for group, counts in summary["groups"].items():
        print(f"  {group:16} " + " ".join(f"{counts[s]:4}" for s in _STATUSES))
    for m in mutants:
        if m.status in ("survived", "error"):
            print(f"\n{m.status.upper()} #{m.id} {m.group} {m.target} line {m.line}: {m.description}\n{m.diff}")
    counted = summary["mutants"] - summary["equivalent"]
    print(f"\nScore: {summary['killed']}/{counted} mutants killed ({summary['score']:.1%}), "
          f"{summary['survived']} survived, {summary['equivalent']} argued equivalent (not run), "
          f"{summary['errors']} errors; hand edits caught {summary['known_edits_caught']}/{summary['known_edits']}; "
          f"{seconds / 60:.1f} minutes")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=[*GROUPS, SEMANTIC],
                        help=f"run only these groups ({SEMANTIC}: the hand-written semantic mutants)")  # fmt: skip
    parser.add_argument("--tests", choices=("now", "before"), default="now",
                        help="before: each group's tests as they were before issue #18 (tests_before)")  # fmt: skip
    parser.add_argument("--jobs", type=whole(1), default=2, help="workers run at once (default 2)")
    parser.add_argument("--all", action="store_true", help="also run the mutants argued equivalent")
    parser.add_argument("--sample", type=whole(1), default=1, metavar="N",
                        help="run only every N-th mutant of each group (a quicker estimate; default: all)")  # fmt: skip
    parser.add_argument("--list", action="store_true", help="list the mutants (hand edits, semantic ones) and stop")
    parser.add_argument("--report", type=Path, default=ROOT / "build" / "mutate" / "report.json")
    args = parser.parse_args(argv)
    if not args.list:
        out_file(parser, "--report", args.report)  # before the hours of running, not after
    original = (ROOT / MODULE).read_text()
    groups = {g: GROUPS[g] for g in (args.only or GROUPS) if g != SEMANTIC}
    mutants = generate(original, groups)
    edits = [e for e in known_edits(original) if e.group in groups]
    semantic = semantic_mutants(original, args.all) if not args.only or SEMANTIC in args.only else []
    for m in semantic:
        if m.status == "error":
            print(f"mutate: ERROR: semantic mutant {m.description!r}: {m.diff}", file=sys.stderr)
    unmatched = [] if args.all else mark_equivalent(mutants, original)
    if args.sample > 1:
        runnable = [m for m in mutants if m.status == "pending"]
        mutants = [m for g in groups for m in [r for r in runnable if r.group == g][:: args.sample]]
    selected = {t for g in groups.values() for t in g.targets}
    for target, line, _ in (u for u in unmatched if u[0] in selected or u[0].split(".")[0] in selected):
        print(f"mutate: no mutant matches the EQUIVALENT entry {target}: {line!r}", file=sys.stderr)
    if args.list:
        for m in mutants:
            print(f"#{m.id} {m.group} {m.target} line {m.line}: {m.description}"
                  + (" (argued equivalent)" if m.status == "equivalent" else ""))  # fmt: skip
        for e in edits:
            print(f"hand edit {e.group} line {e.line}: {e.description}" + (" (error)" if e.status == "error" else ""))
        for m in semantic:
            print(f"semantic line {m.line}: {m.description}" + (f" ({m.status})" if m.status != "pending" else ""))
        print(f"{len(mutants)} mutants, {len(edits)} hand edits, {len(semantic)} semantic mutants")
        return 1 if any(m.status == "error" for m in semantic) else 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutate-") as tmp:
        workers = [Worker(i, Path(tmp)) for i in range(args.jobs)]
        try:
            run_all([*edits, *mutants, *semantic], original, workers, args.tests)
        except BaseException:
            for w in workers:
                w.close(abort=True)
            raise
        for w in workers:
            w.close()
    seconds = time.monotonic() - started
    summary = summarise(mutants, edits)
    if mutants or edits:
        _print_report(summary, mutants, edits, seconds)
    if semantic:
        summary["semantic"] = summarise_semantic(semantic)
        print_semantic(summary["semantic"], semantic)
        print(f"{seconds / 60:.1f} minutes")
    args.report.parent.mkdir(parents=True, exist_ok=True)
    report = {**summary, "seconds": seconds, "tests": args.tests, "sample": args.sample,
              "selection": {g: _selection(g, args.tests) for g in groups},
              "known_edit_results": [asdict(e) | {"source": None} for e in edits],
              "results": [asdict(m) | {"source": None} for m in mutants],
              "semantic_results": [asdict(m) | {"source": None} for m in semantic]}  # fmt: skip
    with replacing(args.report) as partial:  # whole or not at all
        partial.write_text(json.dumps(report, indent=1) + "\n")
    print(f"Report: {args.report}")
    return 1 if any(m.status == "error" for m in semantic) else 0


if __name__ == "__main__":
    run(main)  # killed (SIGTERM) or Ctrl-C: the workers cleaned up, then one line
