"""Semantic mutants: hand-written edits of ``imagenet_classification.py``, each the bug a real
mistake would make in a figure or file a user reads, and the tests of its concern.

``scripts/mutate.py`` applies each (``old`` -> ``new``, exactly once in the module) to a copy of
the module and runs only its ``tests``, stopping at the first failure: a failure kills it. An
``old`` snippet found no time or more than once is reported as an ERROR (the module changed:
re-anchor the snippet), never skipped in silence. Keep snippets short and specific.

``python scripts/mutate.py --only semantic --jobs 1`` runs this group alone (``make mutate-semantic``);
so does ``python scripts/semantic_mutants.py`` (``--list``: list them and stop; ``--help``: the rest).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SemanticMutant:
    """One hand-written edit: what real bug it models, the text it replaces and by what, the
    tests of its concern (pytest node ids), and, if it is argued equivalent, why (then it is not
    run unless ``--all``)."""

    name: str
    old: str
    new: str
    tests: tuple[str, ...]
    equivalent: str = ""


_S = "tests/test_semantic.py::"
_N = "tests/test_numbers.py::"

PREDICTIONS = (_S + "test_predictions_after_bad_images_name_their_own_files",)
PREDICTION_FILES = (_S + "test_prediction_files_hold_the_rows_as_written",)
PARITY = (_S + "test_parity_of_a_loader_known_to_differ",)
PIL_PIXELS = (_S + "test_pil_decoder_equals_timms_transform",)
FFMPEG_PIXELS = (_S + "test_ffmpeg_decoder_follows_timms_transform_in_each_mode",
                 _N + "test_decoded_pixels_match_timms_transform")  # fmt: skip
DEVICE_PIXELS = (_S + "test_device_resize_follows_timms_transform",)
GEOMETRY = (_N + "test_geometry_matches_timms_transform", *PIL_PIXELS, *FFMPEG_PIXELS, *DEVICE_PIXELS)
CONFIG = (_S + "test_a_crop_mode_that_cannot_be_reproduced_is_refused_by_name",
          _N + "test_model_config_reaches_the_transform", *PIL_PIXELS)  # fmt: skip
MODEL_INPUT = (_S + "test_the_models_input_is_timms_normalisation_of_the_loaders_images",)
LABELS = (_S + "test_labels_from_lists_and_label_files_by_hand", "tests/test_layouts.py::test_labels_by_file_name",
          "tests/test_source.py")  # fmt: skip
FOLDERS = (_S + "test_folders_are_listed_in_imagefolders_order_with_its_labels",
           "tests/test_layouts.py::test_folders_are_listed_as_imagefolder_lists_them")  # fmt: skip
SWEEP = (_S + "test_sweep_recommends_the_smallest_setting_within_5_percent_of_the_best",)
RESULTS = (_N + "test_results_and_their_rates_by_hand", _S + "test_results_file_holds_every_reported_figure",
           _N + "test_fps_window_leaves_out_a_slow_warmup")  # fmt: skip
SUMMARY = (_N + "test_summary_of_a_run_without_failures_says_none", _N + "test_fallback_share_in_the_summary_by_hand",
           _N + "test_failures_fallbacks_and_not_reached_reach_the_summary_and_the_results_file",
           _N + "test_a_run_at_the_max_bad_limit_reports_exact_figures")  # fmt: skip
TIMING = (_N + "test_fps_window_leaves_out_a_slow_warmup", _N + "test_timeline_by_hand",
          _N + "test_fps_of_a_window_the_loader_had_buffered_stays_within_its_stated_bound",
          _N + "test_benchmark_defaults_to_the_clis_warmup_and_to_stopping_at_a_bad_image",
          _N + "test_a_batch_whose_images_all_failed_is_no_warmup_batch")  # fmt: skip
BREAKDOWN = (_N + "test_breakdown_bound_and_efficiency_by_hand",
             _S + "test_breakdown_loader_rate_leaves_out_its_slow_warmup")  # fmt: skip
TORCHRUN = (
    _N + "test_torchrun_per_rank_figures",
    "tests/test_hostile5.py::test_a_stopped_jobs_fps_never_mixes_one_ranks_warmup_with_anothers_window",
)

M = SemanticMutant
MUTANTS: list[SemanticMutant] = [
    # --- The six of issue #25 ---------------------------------------------------------------
    M("issue #25: parity compares the loader with itself (reference logits from the loader's images)",
      "_top5(model, [reference[p] for p in paths]), labels))",
      "_top5(model, [ours[p] for p in paths]), labels))", PARITY),
    M("issue #25: after a bad image, decode_batch_ffmpeg names each row by its neighbour's path",
      "_label_tensor(labels, device), paths, failures, 0, decoded_by)",
      "_label_tensor(labels, device), [p for p, _ in items][: len(labels)], failures, 0, decoded_by)", PREDICTIONS),
    M("issue #25: the breakdown's loader-alone rate timed from its first batch (start-up in the bound)",
      "measure_loader(loader.batches, config.device, config.warmup_batches)",
      "measure_loader(loader.batches, config.device, 0)", BREAKDOWN),
    M("issue #25: the PIL path's bicubic is bilinear (_PIL_RESAMPLE['bicubic'] = 2)",
      '"bicubic": 3, "nearest"', '"bicubic": 2, "nearest"', PIL_PIXELS),
    M("issue #25: --sweep recommends the largest setting within 5 % of the best, not the smallest",
      "return next(p for p in measured if", "return next(p for p in reversed(measured) if", SWEEP),
    M("issue #25: predictions' probs are the raw logits, not softmax probabilities",
      "probs = logits.softmax(dim=-1).gather(", "probs = logits.gather(", PREDICTIONS),
    # --- Parity ------------------------------------------------------------------------------
    M("parity's top-1 of the loader and of the reference swapped",
      "hits_ours, hits_ref = (int((top[:, 0] == truth).sum()) for top in (a, b))",
      "hits_ours, hits_ref = (int((top[:, 0] == truth).sum()) for top in (b, a))", PARITY),
    M("parity's reference resized bilinearly whatever the model's interpolation",
      "interpolation=t.interpolation, use_prefetcher", 'interpolation="bilinear", use_prefetcher', PARITY),
    M("parity's denominator counts the images the loader could not decode",
      "n = len(truth)\n    worst", "n = len(items)\n    worst", PARITY),
    M("parity names the image that differs least as the worst",
      "worst = max(mads, key=mads.__getitem__, default=None)\n    finite",
      "worst = min(mads, key=mads.__getitem__, default=None)\n    finite", PARITY),
    M("parity pairs the loader's images with the batch's items, not the paths it decoded",
      "ours = dict(zip(batch.paths, batch[0].cpu(), strict=True))",
      "ours = dict(zip([p for p, _ in chunk], batch[0].cpu(), strict=False))", PARITY),
    # --- Predictions after failures, in every loader, and their files ------------------------
    M("predictions' softmax taken over the batch, not over the classes",
      "logits.softmax(dim=-1).gather(", "logits.softmax(dim=0).gather(", PREDICTIONS),
    M("predictions' correct1 read off the last of the top 5 (an ascending sort)",
      '"correct1": ok and top[0] == label', '"correct1": ok and top[-1] == label', PREDICTIONS),
    M("predictions' probabilities rounded to 2 places", "round(x, 6) for x in p", "round(x, 2) for x in p",
      PREDICTIONS),
    M("predictions' label column holds the predicted class", '"label": label,\n            "label_name"',
      '"label": top[0],\n            "label_name"', PREDICTIONS),
    M("the DataLoader's batch names its rows from every sample, bad ones included",
      "torch.tensor(labels, dtype=torch.int64).view(-1, 1), paths, failures",
      "torch.tensor(labels, dtype=torch.int64).view(-1, 1), [path for path, _ in items][: len(images)], failures",
      PREDICTIONS),
    M("a GPU decoder's batch names its rows by position, not by the images kept",
      "device), [paths[i] for i in kept]\n", "device), paths[: len(kept)]\n", PREDICTIONS),
    M("a GPU decoder's batch labels its rows by position, not by the images kept",
      "_label_tensor([labels[i] for i in kept], device)", "_label_tensor(labels[: len(kept)], device)", PREDICTIONS),
    M("an image a GPU decoder left and the CPU could not decode counted as a fallback",
      "_Batch(batch, labels_kept, paths_kept, failures, len(decoded), decoded_by)",
      "_Batch(batch, labels_kept, paths_kept, failures, len(left), decoded_by)",
      PREDICTIONS),
    M("the predictions CSV's correct1 and correct5 columns swapped",
      'correct1=int(r["correct1"]), correct5=int(r["correct5"])',
      'correct1=int(r["correct5"]), correct5=int(r["correct1"])', PREDICTION_FILES),
    M("the predictions CSV's probs column holds the classes",
      'probs=" ".join(map(str, probs))', 'probs=" ".join(map(str, top5))', PREDICTION_FILES),
    M("the predictions JSONL file loses its last row",
      'json.dumps(r) + "\\n" for r in rows)', 'json.dumps(r) + "\\n" for r in rows[:-1])', PREDICTION_FILES),
    # --- Decoding: every interpolation and crop mode ----------------------------------------
    M("the PIL path's nearest neighbour is a box filter (PIL's 4)", '"nearest": 0, "lanczos": 1}',
      '"nearest": 4, "lanczos": 1}', PIL_PIXELS),
    M("the PIL path's crop box with x and y swapped",
      "resized.crop((left, top, left + transform.size, top + transform.size))",
      "resized.crop((top, left, top + transform.size, left + transform.size))", PIL_PIXELS),
    M("FFmpeg's nearest neighbour is bilinear", '"nearest": "neighbor"', '"nearest": "bilinear"', FFMPEG_PIXELS),
    M("FFmpeg's lanczos is bicubic", '"lanczos": "lanczos"}', '"lanczos": "bicubic"}', FFMPEG_PIXELS),
    M("FFmpeg's crop offsets swapped (x for y)", "crop={self.size}:{self.size}:{pad_x}:{pad_y}",
      "crop={self.size}:{self.size}:{pad_y}:{pad_x}", FFMPEG_PIXELS),
    M("FFmpeg's output packed BGR", "format=gbrp,{crop},format=rgb24", "format=gbrp,{crop},format=bgr24",
      FFMPEG_PIXELS),
    M("FFmpeg pads a crop wider than the image (crop_pct > 1) on one side only",
      "pad={self.size}:{self.size}:{max(-left, 0)}:{max(-top, 0)}", "pad={self.size}:{self.size}:0:0", FFMPEG_PIXELS),
    M("squash resizes straight to the crop size, not to size / crop_pct",
      "new_w = new_h = short", "new_w = new_h = self.size", GEOMETRY),
    M("a crop wider than the image starts at round((side - crop) / 2), a pixel off torchvision's padding",
      "if length >= crop else -((crop - length) // 2)", "if length >= crop else round((length - crop) / 2)",
      PIL_PIXELS),
    M("the model's crop mode ignored (squash and border taken as center)",
      'mean, std, cfg["crop_mode"])', 'mean, std, "center")', CONFIG),
    M("the device resize without antialiasing", 'antialias=mode != "nearest"', "antialias=False", DEVICE_PIXELS),
    M("the model's input not scaled from 0-255 to 0-1 before normalising",
      "(x.float() / 255.0 - self.mean) / self.std", "(x.float() - self.mean) / self.std", MODEL_INPUT),
    M("the model fed BGR", "return self.model(self.preprocessing(images).to(self.dtype))",
      "return self.model(self.preprocessing(images.flip(1)).to(self.dtype))", MODEL_INPUT),
    # --- Labels and folder order ------------------------------------------------------------
    M("a list's class index read as 1-based", "        return index\n    return None",
      "        return index - 1\n    return None", LABELS),
    M("a path's class is its first WordNet ID folder, not the innermost", "return folders[-1]",
      "return folders[0]", LABELS),
    M("Kaggle's label from the last box of the prediction string", "fields = rest.split()\n",
      "fields = rest.split()[-5:]\n", LABELS),
    M("labels by file name keyed with the extension", "_one_class(first, _image_name(name.strip()), label",
      "_one_class(first, name.strip(), label", LABELS),
    M("a folder's files in directory-listing order", "folders.append((path, sorted(images)))",
      "folders.append((path, list(images)))", FOLDERS),
    M("nested folders depth first, not in ImageFolder's sorted(os.walk) order", "for path, names in sorted(folders):",
      "for path, names in folders:", FOLDERS),
    M("image extensions matched case-sensitively (.JPEG missed)",
      "images = {e.name for e in entries if e.name.lower().endswith(",
      "images = {e.name for e in entries if e.name.endswith(", FOLDERS),
    M("class folders in directory-listing order",
      'top = sorted((e for e in it if e.name[0] != "."), key=lambda e: e.name)',
      'top = [e for e in it if e.name[0] != "."]', FOLDERS),
    # --- Figures of the run: FPS, accuracy, counts, timeline, summary, results file ---------
    M("FPS over every image classified, warm-up included", "return self.frames_timed / self.elapsed_s if",
      "return self.classified / self.elapsed_s if", RESULTS),
    M("top-1 over the images classified and failed",
      "return self.top1_correct / self.classified if", "return self.top1_correct / (self.classified + self.failed) if",
      RESULTS),
    M("top-5 over the images listed", "return self.top5_correct / self.classified if",
      "return self.top5_correct / self.listed if", RESULTS),
    M("not_reached forgets the failed images", "max(0, self.listed - self.classified - self.failed)",
      "max(0, self.listed - self.classified)", RESULTS),
    M("a batch's bad images after its first are lost",
      '    failures += getattr(batch, "failures", ())\n\n\ndef _label_tensor',
      '    failures += getattr(batch, "failures", ())[:1]\n\n\ndef _label_tensor', TIMING),
    M("the warm-up's last batch counted in the FPS window",
      "self.timed_from = self.batches\n",
      "self.timed_from = self.batches\n            self.frames += frames\n", TIMING),
    M("batches_timed counts the warm-up", "window.batches - window.timed_from if window.timed",
      "window.batches if window.timed", TIMING),
    M("the timeline counts batches, not images", "images[int(t // interval)] += frames",
      "images[int(t // interval)] += 1", TIMING),
    M("the FPS window ends when the loader does (SPDL's end of stream, a stall's time-out), not at its last batch",
      "return self.frames, self.t_last - self.t_warm, False", "return self.frames, self.t_end - self.t_warm, False",
      (_N + "test_fps_window_ends_with_the_last_batch_not_the_loaders_end_or_a_stop",)),
    M("the timeline's end is the FPS window's length", '"end_s": self.t_end - self.t_start,',
      '"end_s": self.t_end - self.t_warm,', TIMING),
    M("the fallback share of the images listed, not of those classified",
      "share = result.decoder_fallbacks / result.classified if result.classified else 1.0",
      "share = result.decoder_fallbacks / result.listed if result.listed else 1.0", SUMMARY),
    M("the FPS line shows the images classified, not those timed",
      "({result.frames_timed}/{_in_seconds(result.elapsed_s)})",
      "({result.classified}/{_in_seconds(result.elapsed_s)})", SUMMARY),
    M("the top-5 line shows the top-1 count", '("5", result.top5_correct, result.top5)',
      '("5", result.top1_correct, result.top5)', SUMMARY),
    M("the results file holds the result alone (no config, ranks, breakdown, parity)",
      "json.dumps(report.to_dict(), indent=2)", "json.dumps(report.result.to_dict(), indent=2)", RESULTS),
    M("a torchrun job's elapsed time summed over the ranks, not the longest rank's",
      'elapsed_s=max(s["elapsed_s"] for s in timed)', 'elapsed_s=sum(s["elapsed_s"] for s in timed)', TORCHRUN),
    # --- The breakdown --------------------------------------------------------------------
    M("the breakdown's end-to-end rate over every image and the whole run",
      "from_rates(loader_fps, model_fps, result.fps, config.device, read)",
      "from_rates(loader_fps, model_fps, result.classified / result.elapsed_s, config.device, read)", BREAKDOWN),
    M("the breakdown's efficiency over the CPU's rate of taking turns, not the bound",
      "e2e_fps / bound if bound else 0.0", "e2e_fps / (shared or bound) if bound else 0.0", BREAKDOWN),
    M("the breakdown names the faster side the bottleneck",
      'bottleneck = "loader" if loader_fps < model_fps else "model"',
      'bottleneck = "model" if loader_fps < model_fps else "loader"', BREAKDOWN),
    M("the breakdown line's loader and model rates swapped",
      "loader alone {b.loader_fps:.1f} | model alone {b.model_fps:.1f}",
      "loader alone {b.model_fps:.1f} | model alone {b.loader_fps:.1f}", BREAKDOWN),
    # --- The sweep -------------------------------------------------------------------------
    M("the sweep's candidates by the loader's rate alone, though the model caps it",
      "near = [p for p in self.points if p.bound_fps >=", "near = [p for p in self.points if p.loader_fps >=",
      SWEEP),
    M("the sweep's smallest setting by batch size first, not by threads",
      "key=lambda p: (p.threads, p.decode_processes, p.batch_size, p.queue_size)",
      "key=lambda p: (p.batch_size, p.threads, p.decode_processes, p.queue_size)", SWEEP),
    M("nothing run end to end: the sweep recommends the best bound, not the smallest candidate",
      "return self.candidates[0]", "return max(self.points, key=lambda p: p.bound_fps)", SWEEP),
    M("the sweep table's loader and model columns swapped", "{p.loader_fps:9.1f} {p.model_fps:9.1f} {e2e}",
      "{p.model_fps:9.1f} {p.loader_fps:9.1f} {e2e}", SWEEP),
    M("the recommended command line keeps a --batch-size=N of the sweep's command",
      'name = word.split("=")[0]', "name = word", SWEEP),
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """This group alone, run by ``scripts/mutate.py`` (``--only semantic``) with these options."""
    import argparse

    from cli_checks import whole
    from mutate import ROOT
    from mutate import main as mutate

    parser = argparse.ArgumentParser(description="Run the semantic mutants alone, as make mutate-semantic does.")
    parser.add_argument("--list", action="store_true", help="list the mutants (their lines in the module) and stop")
    parser.add_argument("--jobs", type=whole(1), default=1, help="workers run at once (default 1)")
    parser.add_argument("--all", action="store_true", help="also run the mutants argued equivalent")
    parser.add_argument("--tests", choices=("now", "before"), default="now",
                        help="before: without tests/test_semantic.py, which issue #25 added")  # fmt: skip
    parser.add_argument("--report", default=str(ROOT / "build" / "mutate" / "report.json"))
    args = parser.parse_args(argv)
    forwarded = ["--only", "semantic", "--jobs", str(args.jobs), "--tests", args.tests, "--report", args.report]
    return mutate(forwarded + ["--list"] * args.list + ["--all"] * args.all)


if __name__ == "__main__":
    from cli_checks import run

    run(main)
