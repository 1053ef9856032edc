"""`flatcheck spec`: the fully resolved spec of a model, with where each field came from;
`flatcheck embed-spec`: a spec written into a safetensors checkpoint, so it says what it is."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from .kit import READS, WRITES, Checkpoint, command, guarded, shared_options

# the model flags every probe command has, with the same names, help and defaults
_FLAG = {name: annotation for name, annotation, _ in shared_options()}


@command("spec", help="Write the fully resolved model spec (library metadata filled in, each field's origin "
                          "as a comment) for --model, --spec or a checkpoint that says what it is.")
def spec_cmd(
    checkpoint: Checkpoint = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="write the YAML here [default: stdout]"),
                   WRITES] = None,
    spec: _FLAG["spec"] = None,
    model: _FLAG["model"] = None,
    num_classes: _FLAG["num_classes"] = None,
    input_size: _FLAG["input_size"] = None,
    mean: _FLAG["mean"] = None,
    std: _FLAG["std"] = None,
    spec_set: _FLAG["spec_set"] = None,
    trust_packages: _FLAG["trust_packages"] = None,
    debug: _FLAG["debug"] = False,
):
    def body() -> int:
        from .kit import model_request
        from ..models.load import build_with_weights
        from ..models.resolve import describe
        from ..models.spec import spec_yaml
        from ..report.io import check_distinct_files, check_writable, write_text_atomic

        check_distinct_files([(f, str(p), w) for f, p, w in (("CHECKPOINT", checkpoint, False),
                              ("--spec", spec, False), ("--out", out, "spec")) if p is not None])
        if out is not None:
            check_writable(out, "--out")
        request = model_request(checkpoint, {
            "spec": spec, "model": model, "pretrained": False, "random_init": True, "num_classes": num_classes,
            "input_size": input_size, "mean": mean, "std": std, "spec_set": spec_set})
        # built at random init, never with weights: the library's metadata needs the model only
        _, full, _ = build_with_weights(describe(request), None, tuple(trust_packages or ()))
        text = spec_yaml(full)
        if out is None:
            typer.echo(text, nl=False)
        else:
            write_text_atomic(out, text)
        return 0

    guarded(debug, body)


@command("embed-spec", help="Write a model spec into a .safetensors checkpoint's metadata (atomically; the "
                                "tensors' bytes are untouched), so that the checkpoint alone says what it is.")
def embed_spec_cmd(
    checkpoint: Annotated[Path, typer.Argument(help="the .safetensors checkpoint", show_default=False), READS],
    spec: Annotated[Path, typer.Option("--spec", help="model spec YAML to embed"), READS],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="write the result here [default: in "
                                                                    "place]"), WRITES] = None,
    trust_packages: _FLAG["trust_packages"] = None,
    debug: _FLAG["debug"] = False,
):
    def body() -> int:
        from ..models.embed import check_spec_fits, embed_spec
        from ..models.spec import load_spec, spec_to_dict
        from ..report.io import check_distinct_files, check_writable

        check_distinct_files([("--spec", str(spec), False), *([("--out", str(out), "checkpoint")] if out else [])])
        if out is not None:
            check_writable(out, "--out")
        loaded = load_spec(spec)
        check_spec_fits(loaded, checkpoint, tuple(trust_packages or ()))  # before the file is touched
        target = embed_spec(checkpoint, spec_to_dict(loaded), out)
        typer.echo(f"embedded {spec} in {target}", err=True)
        if loaded.source == "python":
            # said now, not first when the checkpoint is run: a checkpoint's own spec imports no
            # module the person running it did not name (models.sources._ImportPolicy)
            module = (loaded.arch or "").partition(":")[0]
            typer.echo(f"flatcheck: warning: the spec builds the model by importing {module}; run {target} with "
                       f"--trust-package {module} (a checkpoint's own spec imports nothing unnamed), where {module} "
                       "is installed or in the working directory, or keep passing --spec", err=True)
        return 0

    guarded(debug, body)
