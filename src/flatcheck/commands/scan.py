"""`flatcheck scan`: the same probes over many models, one JSONL record each."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..settings import default_of, flag_of
from .kit import command, console, guarded, setting_options

# the run's settings that a scan takes as every probe command does, declared once (flatcheck.settings);
# data, samples, device and budget are said per model here, with help of their own
SETTING = {name: annotation for name, annotation, _ in setting_options(budget=True)}
from ..errors import interrupted

_HELP = ("Run probes over many models (a timm pattern, a file of names, a folder of checkpoints + specs); "
         "append one JSON line per model to --out. Each model runs in its own process, so one the system "
         "kills for memory is recorded and the scan goes on. Under torchrun, or with --shard I/N, each "
         "rank writes OUT.rankN.")


@command("scan", help=_HELP)
def scan_cmd(
    out: Annotated[Path, typer.Option("--out", help="JSONL file the records are appended to")],
    timm_pattern: Annotated[Optional[list[str]], typer.Option("--timm", help="timm.list_models pattern, e.g. "
                                                              "'vit_*' (repeatable)")] = None,
    pretrained: Annotated[bool, typer.Option("--pretrained", help="pretrained weights, from local disk only "
                                             "(HF cache or --weights-dir); models without them are skipped")] = False,
    models_file: Annotated[Optional[Path], typer.Option("--models-file", help="timm model names, one per line")] = None,
    model: Annotated[Optional[list[str]], typer.Option("--model", help="a model by name, repeatable: timm:NAME, "
                                                       "torchvision:NAME or python:MODULE:FUNCTION (random init "
                                                       "unless --pretrained)")] = None,
    num_classes: Annotated[Optional[int], typer.Option("--num-classes", help="spec field num_classes for "
                                                       "every --timm/--model model")] = None,
    mean: Annotated[Optional[str], typer.Option("--mean", help="per-channel mean, e.g. 0.5,0.5,0.5 (with --std)")] = None,
    std: Annotated[Optional[str], typer.Option("--std", help="per-channel std (with --mean)")] = None,
    set_fields: Annotated[Optional[list[str]], typer.Option("--set", help="FIELD=VALUE: any other spec field of "
                                                            "every --timm/--model model (VALUE is YAML), "
                                                            "repeatable")] = None,
    checkpoints: Annotated[Optional[Path], typer.Option("--checkpoints", help="folder of NAME.safetensors|pt "
                                                        "with NAME.yaml (or one spec.yaml) beside them")] = None,
    weights_dir: Annotated[Optional[Path], typer.Option("--weights-dir", help="folder of NAME.safetensors or "
                                                        "NAME/model.safetensors pretrained weights")] = None,
    model_kwargs: Annotated[Optional[list[str]], typer.Option("--model-kwargs", help="KEY=VALUE for the timm "
                                                              "constructor, repeatable (e.g. img_size=64)")] = None,
    input_size: Annotated[Optional[str], typer.Option("--input-size", help="override timm's data config: S (= 3,S,S) "
                                                      "or C,H,W (use with e.g. --model-kwargs img_size=S); a flat D: "
                                                      "--set 'input_size=[D]'")] = None,
    probes: Annotated[Optional[str], typer.Option("--probes", help="comma-separated probe names [default: "
                                                  "trace,gini, or the preset's]", show_default=False)] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help="a paper's protocol: mls-vs-sharpness (Chen et "
                                                  "al. 2023 Fig. 4: sigmoid+MSE adaptive sharpness and normalized "
                                                  "MLS, 1000 samples or the whole split if smaller); your own "
                                                  "flags override it")] = None,
    shard: Annotated[Optional[str], typer.Option("--shard", help="I/N: this process is shard I (from 0) of N "
                                                 "started independently (a job array); writes OUT.rankI")] = None,
    option: Annotated[Optional[list[str]], typer.Option("--option", "-o", help="PROBE.KEY=VALUE, repeatable")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="skip models already in --out (same settings)")] = False,
    retry_errors: Annotated[bool, typer.Option("--retry-errors", help="with --resume: redo models that "
                                               "failed")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="start --out afresh")] = False,
    allow_errors: Annotated[bool, typer.Option("--allow-errors", help="exit 0 when some models failed, as long "
                                               "as one succeeded [default: any failed model is exit 1]")] = False,
    data: Annotated[str, typer.Option("--data", help="data set (see `flatcheck probe --help`)")] = "synthetic",
    data_root: Annotated[Optional[Path], typer.Option("--data-root", help="folder of torchvision data sets")] = None,
    split: SETTING["split"] = "train",
    samples: Annotated[Optional[int], typer.Option("--samples", help="first N samples per model [default: "
                                                   "flatcheck's, or the preset's]")] = None,
    batch_size: SETTING["batch_size"] = default_of("batch_size"),
    device: Annotated[str, typer.Option("--device", help="auto, cpu, cuda, cuda:N (auto under torchrun: "
                                        "cuda:LOCAL_RANK)")] = "auto",
    dtype: SETTING["dtype"] = str(default_of("dtype")),
    bn_mode: SETTING["bn_mode"] = str(default_of("bn_mode")),
    seed: SETTING["seed"] = default_of("seed"),
    params: SETTING["params"] = None,
    backend: SETTING["backend"] = default_of("backend"),
    trust_package: Annotated[Optional[list[str]], typer.Option("--trust-package", help="let 'source: python' "
                                                                "specs import this package (repeatable)")] = None,
    budget: Annotated[Optional[float], typer.Option("--budget", help="seconds per model for its probes: "
                                                    "iterative ones stop when it is spent and report what they "
                                                    "reached (details.stop_reason: budget) [default: none]")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress on stderr")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks")] = False,
):
    def body() -> int:
        import warnings

        from ..config import RunConfig, parse_option_assignments, probe_requests
        from ..data.registry import parse_uri
        from ..workflows.presets import preset as find_preset
        from ..workflows.scan import Placement, refuse_shared_setup, run_scan
        from ..workflows.scan_sources import parse_kwargs

        if resume and overwrite:
            raise _config_error("--resume and --overwrite contradict each other")
        if retry_errors and not resume:
            raise _config_error("--retry-errors needs --resume: it redoes the models a resumed scan's --out "
                                "recorded as errors")
        placement = Placement.from_shard(shard) if shard is not None else Placement.from_env()
        parse_uri(data)  # an unknown data set is the user's error, not every model's
        from ..data.roots import refuse_missing

        refuse_missing(data, data_root, split)  # a root without the set's files, before any model loads
        chosen = find_preset(preset) if preset is not None else None
        names = probes or (chosen.probes if chosen else "trace,gini")
        assignments = [*(chosen.options if chosen else ()), *(option or [])]  # the user's -o come last and win
        if chosen and probes:
            names_given = {n.strip() for n in probes.split(",")}
            assignments = [a for a in assignments if a.split(".", 1)[0] in names_given or a in (option or [])]
        from ..workflows.child_process import parent_without_pool

        # the parent reads the data's size and builds specs (and some models) before the first
        # fork: on one thread, so that it never starts the OpenMP pool a forked child could not
        # use (child_process)
        with parent_without_pool():
            base = RunConfig(
                checkpoint=None, spec=Path("<per model>"),
                probes=probe_requests(names, parse_option_assignments(assignments)),
                data=data, data_root=data_root, split=split,
                samples=_samples(samples, chosen, data, data_root, split, seed, quiet), batch_size=batch_size,
                device=_device_for(device, placement), dtype=dtype, bn_mode=bn_mode, seed=seed,
                params=tuple(p.strip() for p in (params or "").split(",") if p.strip()), backend=backend,
                trust_packages=trust_package, budget=budget,
            )
            from ..models.resolve import ModelRequest

            # the spec fields the shared flags set, as every probe command reads them (models.resolve)
            request = ModelRequest(pretrained=pretrained, random_init=not pretrained, num_classes=num_classes,
                                   mean=mean, std=std, sets=tuple(set_fields or ()))
            entries = _entries(timm_pattern or [], models_file, checkpoints, pretrained, weights_dir,
                               parse_kwargs(model_kwargs or []), _parse_size(input_size), model or [], request)
            refuse_shared_setup(entries, base, placement)  # before the progress display starts
            with warnings.catch_warnings():
                if quiet:
                    warnings.simplefilter("ignore")
                try:
                    summary = _run_with_progress(run_scan, entries, base, out, resume, overwrite, retry_errors,
                                                 placement, quiet)
                except KeyboardInterrupt:
                    from ..workflows.scan import shard_path

                    target = shard_path(out, placement.rank, placement.world_size)
                    interrupted(f"every finished model is in {target}; continue with --resume")
                    raise
        _print_summary(summary, chosen.figure if chosen is not None else {})
        code = _exit_code(summary, allow_errors)
        if summary.moved and summary.elsewhere:
            # exit 2 as for every output not where asked (report.io.lost_outputs_error)
            raise _config_error(f"{summary.moved}; exit 2 as the records are not at --out (the scan's own exit "
                                f"code: {code})")
        if summary.moved:
            from .kit import error_line

            error_line(f"flatcheck scan: warning: {summary.moved}")  # even with --quiet: the file was remade
        return code

    guarded(debug, body)


def _config_error(msg: str):
    from ..errors import ConfigError

    return ConfigError(msg)


def _samples(given, chosen, data, data_root, split, seed, quiet) -> int | None:
    """The scan's sample count, held against its data before any model runs. --samples N
    beyond the split is refused (exit 2), as a one-model command refuses it, rather than
    recorded as every model's error. A preset's own count is a default, and acts like
    flatcheck's (1000, or the whole split if smaller): a smaller split is measured whole, and
    the scan says so, since the paper's protocol named more."""
    wanted = given if given is not None else chosen.samples if chosen is not None else None
    if wanted is None or wanted < 1:
        return wanted  # flatcheck's default (api.open_session), or a count RunConfig refuses
    from ..workflows.scan_sources import split_size

    have, name = split_size(data, data_root, split, seed)
    if wanted <= have:
        return wanted
    if given is not None:
        from ..errors import DataError

        raise DataError(f"--samples {given} is more than the {have} samples of data '{name}' split '{split}'")
    _say(f"flatcheck scan: --preset {chosen.name} takes {chosen.samples} samples, more than the {have} of data "
         f"'{name}' split '{split}': measuring all {have}, as --samples' default does", quiet)
    return have


def _device_for(device: str, placement) -> str:
    if device == "auto" and placement.world_size > 1:
        import torch

        if torch.cuda.is_available():
            return f"cuda:{placement.local_rank % torch.cuda.device_count()}"
    return device


def _parse_size(text: str | None) -> tuple[int, ...] | None:
    from ..models.resolve import parse_input_size  # the one parser every command's --input-size uses

    return None if text is None else parse_input_size(text)


def _entries(patterns, models_file, checkpoints, pretrained, weights_dir, kwargs, input_size, refs, request):
    from dataclasses import replace

    from ..models.resolve import flag_fields
    from ..workflows.scan_sources import checkpoint_entries, model_entry, names_from_file, timm_entry, timm_names

    if not patterns and models_file is None and checkpoints is None and not refs:
        raise _config_error("nothing to scan: give --timm PATTERN, --models-file FILE, --model REF or "
                            "--checkpoints DIR")
    fields = flag_fields(request)
    if fields and not (patterns or models_file or refs):
        raise _config_error("--num-classes/--mean/--std/--set set fields of --timm/--models-file/--model models; "
                            "a checkpoint folder's models take theirs from their specs")
    if weights_dir is not None and not weights_dir.is_dir():
        raise _config_error(f"--weights-dir {weights_dir}: not a folder")
    names: list[str] = []
    for pattern in patterns:
        names += timm_names(pattern, pretrained)
    if models_file is not None:
        names += names_from_file(models_file)
    entries = [timm_entry(n, pretrained=pretrained, kwargs=kwargs, input_size=input_size, weights_dir=weights_dir,
                          fields=fields) for n in dict.fromkeys(names)]
    if refs and (kwargs or weights_dir is not None):
        raise _config_error("--model-kwargs/--weights-dir are for --timm/--models-file names; with --model use "
                            "--set kwargs.KEY=VALUE, and --pretrained reads the library's local cache")
    sized = replace(request, input_size=None if input_size is None else ",".join(map(str, input_size)))
    entries += [model_entry(ref, sized) for ref in dict.fromkeys(refs)]
    if checkpoints is not None:
        entries += checkpoint_entries(checkpoints)
    return entries


def _say(msg: str, quiet: bool) -> None:
    if not quiet:
        from .kit import error_line

        error_line(msg)


class _ModelProgress:
    """The scan's display for the model in progress: its call and its hooks (a probe's begin
    and end, a budget's stop and share, the counts within a product), with each description and
    probe name prefixed by the model's, so that its lines say which model they are about and a
    probe's end line finds its stage's."""

    def __init__(self, progress, where: dict, tag: str):
        self.progress, self.where, self.tag = progress, where, tag

    def _named(self, what: str) -> str:
        return f"{self.tag}{self.where['name']}: {what}"

    def __call__(self, desc, done, total, **estimate):
        self.progress(self._named(desc), done, total, **estimate)

    def began(self, probe):
        self.progress.began(self._named(probe))

    def ended(self, probe, value, stderr, dof=None, bound=None):
        self.progress.ended(self._named(probe), value, stderr, dof, bound)

    def stopped(self, desc, reason, planned=None):
        self.progress.stopped(self._named(desc), reason, planned)

    def budget(self, desc, seconds):
        self.progress.budget(self._named(desc), seconds)

    def within(self, *counts, **kinds):
        self.progress.within(*counts, **kinds)


def _run_with_progress(run_scan, entries, base, out, resume, overwrite, retry_errors, placement, quiet):
    from ..report.progress import ProgressRenderer, Task, clock_text, period_from_env
    from ..workflows.scan import ScanHooks

    tag = f"[rank {placement.rank}/{placement.world_size}] " if placement.world_size > 1 else ""
    if quiet:
        return run_scan(entries, base, out, resume=resume, overwrite=overwrite, retry_errors=retry_errors,
                        placement=placement)
    err = console(stderr=True)
    # a bar per probe at a terminal, plain lines elsewhere (a line at least every 15 s even while a
    # model loads); a line per model done, with the scan's ETA from the models done so far
    with ProgressRenderer(err.file, interactive=err.is_interactive, period=period_from_env(),
                          phase=f"{tag}starting the scan", name_of=flag_of) as progress:
        models = Task(f"{tag}models", started=progress.clock(), warmup=False)
        where = {"name": "", "index": 0, "total": 0}

        def start(i, total, entry):
            where.update(name=entry.name, index=i, total=total)
            progress.stage(f"{tag}model {i + 1}/{total}: loading {entry.name}")

        def done(rec):
            models.update(progress.clock(), where["index"] + 1, where["total"], None, None)
            extra = f" — {rec['error']}" if rec["error"] else ""
            progress.note(f"flatcheck scan: {tag}{rec['status']}  {rec['model']}  {rec['seconds']:.1f}s{extra} · "
                          f"{models.done}/{models.total} models · ETA {clock_text(models.eta())}")

        summary = run_scan(entries, base, out, resume=resume, overwrite=overwrite, retry_errors=retry_errors,
                           placement=placement, hooks=ScanHooks(start, done, _ModelProgress(progress, where, tag)))
    if summary.repaired_bytes:
        err.print(f"flatcheck scan: {tag}dropped a partial last line ({summary.repaired_bytes} bytes) of {summary.out}")
    if summary.already:
        err.print(f"flatcheck scan: {tag}{summary.already} of {summary.total} models already in {summary.out} (resume)")
    if summary.total == 0 and placement.world_size > 1:
        # more shards than models: an empty OUT.rankI is right, but should not pass unremarked
        err.print(f"flatcheck scan: {tag}no model falls to this shard ({len(entries)} models over "
                  f"{placement.world_size} shards); {summary.out} holds none")
    return summary


def _exit_code(summary, allow_errors: bool) -> int:
    """1 when a model of the scan failed (its latest record, this run's or an earlier one kept by
    --resume), unless --allow-errors and another model succeeded; a scan in which none
    succeeded is never 0. Skipped models (no local weights, no spec) are not failures."""
    from .kit import error_line

    latest = summary.latest()
    failed = [r["model"] for r in latest if r["status"] == "error"]
    succeeded = any(r["status"] == "ok" for r in latest)
    if not failed or (allow_errors and succeeded):
        return 0
    # said even with --quiet: it is why the exit code is 1
    names = ", ".join(failed[:5]) + (" …" if len(failed) > 5 else "")
    hint = "" if allow_errors or not succeeded else ", or pass --allow-errors to exit 0 when one model succeeded"
    error_line(f"flatcheck scan: {len(failed)} of {len(latest)} models failed ({names}){'; none succeeded' if not succeeded else ''}: "
                f"their records are in {summary.out}; redo them with --resume --retry-errors{hint}")
    return 1


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in counts.items())


def _print_summary(summary, figure: dict | None = None) -> None:
    from rich.table import Table

    from ..report.render import fmt_pm, fmt_result

    kept = (f"; {summary.already} already done ({_counts(summary.counts(summary.earlier))})"
            if summary.already else "")
    if not summary.records and summary.already:
        # nothing to measure: an empty table would read as a scan of no models
        console().print(f"scan → {summary.out}: nothing left to do, all {summary.already} models are already "
                        f"in it ({_counts(summary.counts(summary.earlier))}; --resume)")
        return
    # the counts on a line of their own: as the table's title they wrapped to the table's width
    console().print(f"scan → {summary.out}: {_counts(summary.counts())}{kept}", soft_wrap=True, markup=False,
                    highlight=False)
    table = Table()
    probes = list(dict.fromkeys(p for r in summary.records for p in r.get("results", {})))
    # a preset's figure may plot a detail rather than the headline (mls-vs-sharpness: the
    # normalized MLS): that field gets its own column, so the table shows what the figure will;
    # none for a probe the scan did not run (--probes chose others), which would be all dashes
    extra = [f for f in ((figure or {}).get("x"), (figure or {}).get("y"))
             if isinstance(f, str) and "." in f and f.partition(".")[0] in probes]
    for col in ("model", "status", "seconds", *probes, *extra):
        table.add_column(col, justify="left" if col in ("model", "status") else "right")
    for r in summary.records:
        res = r.get("results", {})
        cells = [fmt_result(res[p]["value"], res[p]["stderr"], res[p].get("resolved", True),
                            res[p].get("error_bound"), res[p].get("dof")) if p in res else "—"
                 for p in probes]
        for f in extra:
            probe, _, key = f.partition(".")
            value = ((res.get(probe) or {}).get("details") or {}).get(key)
            cells.append(fmt_pm(value, None) if isinstance(value, (int, float)) else "—")
        table.add_row(r["model"], r["status"], f"{r['seconds']:.1f}", *cells)
    console().print(table)
    # each failure's whole line below the table, once for the models it shares: the remedy is at
    # its end (pass --trust-package …), where a table cell cut it off
    why: dict[tuple[str, str], list[str]] = {}
    for r in summary.records:
        if r["error"]:
            why.setdefault((r["status"], r["error"]), []).append(r["model"])
    for (status, error), models in why.items():
        console().print(f"{status} ({', '.join(models)}): {error}", soft_wrap=True, markup=False, highlight=False)
