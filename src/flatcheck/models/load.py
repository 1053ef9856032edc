"""A model with its weights and its fully resolved spec: what a run (api.open_session) and
`flatcheck.load_model` both make from a spec and a weights file."""

from __future__ import annotations

import os
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from flatcheck.errors import CheckpointError
from flatcheck.models.checkpoint import (LoadedCheckpoint, apply_state_dict, fitting_prefix, load_checkpoint,
                                        strip_prefix)
from flatcheck.models.pretrained import offline
from flatcheck.models.resolve import ModelRequest, resolve
from flatcheck.models.sources import build_model, complete_spec
from flatcheck.models.spec import CheckpointSpec, ModelSpec


def build_with_weights(spec: ModelSpec, checkpoint: Path | None, trust_packages: Sequence[str] = (),
                       seed: int = 0, dtype: torch.dtype | None = torch.float32
                       ) -> tuple[nn.Module, ModelSpec, LoadedCheckpoint | None]:
    """The model of `spec` with `checkpoint`'s weights (strictly; None: as built, random init),
    in `dtype` (None: as the checkpoint stores them), and the spec completed from the library's
    metadata (sources.complete_spec).

    The weights are loaded in the checkpoint's own precision and only then cast to `dtype`, so
    float64 weights measured in float64 are the file's to the bit; a cast that rounds them
    (float64 weights, float32 run) is said once as a warning and recorded in the returned
    checkpoint's `cast` (the report's meta.checkpoint.cast), so that --quiet does not lose it.

    The model is built from `seed` (the run's --seed), on a forked RNG: a random
    initialisation is the same in every run with that seed, and the caller's RNG state is
    left as it was."""
    # offline: a library asked to build a model must not fetch anything for it
    with offline(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(spec, trust_packages=trust_packages)
    loaded = None
    if checkpoint is not None:
        loaded = load_checkpoint(checkpoint, spec.checkpoint)
        if spec.checkpoint.strip_prefix is None:
            loaded, spec = _strip_fitting_prefix(loaded, spec, model)
        stored = _widest_float(loaded.state_dict)
        if stored is not None and torch.finfo(stored).bits > 32:
            model.to(dtype=stored)  # built in float32: widen before loading, or the load rounds
        apply_state_dict(model, loaded.state_dict, source=str(checkpoint), model_from=model_origin(spec))
        loaded = replace(loaded, cast=_cast(model, dtype or model_dtype(model), stored, str(checkpoint)))
    else:
        model.to(dtype=dtype or torch.float32)
    return model, complete_spec(spec, model), loaded


def model_dtype(model: nn.Module) -> torch.dtype:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def _widest_float(state: dict[str, torch.Tensor]) -> torch.dtype | None:
    kinds = {v.dtype for v in state.values() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    return max(kinds, key=lambda d: (torch.finfo(d).bits, torch.finfo(d).eps < 1e-3), default=None)


def _cast(model: nn.Module, dtype: torch.dtype, stored: torch.dtype | None, source: str) -> dict[str, Any]:
    """`model` (holding a checkpoint's weights as stored) in `dtype`; a cast that rounds the
    weights is said, and one that overflows them is refused (it would measure infinities).
    What the cast did, for the report: the dtypes, the tensors it rounded, the relative
    rounding of one (half dtype's eps; 0 when none was rounded) and the warning, or None."""
    rounded, overflown = 0, []
    if stored is not None and stored != dtype:
        for name, t in (*model.named_parameters(), *model.named_buffers()):
            if t.is_floating_point() and t.dtype != dtype:
                back = t.detach().to(dtype)
                overflown += [name] if not bool(torch.isfinite(back).all()) else []
                rounded += not torch.equal(back.to(t.dtype), t.detach())
    if overflown:
        raise CheckpointError(f"{source}: {len(overflown)} tensors ({', '.join(overflown[:3])}) hold values beyond "
                              f"{_name(dtype)}'s range (±{torch.finfo(dtype).max:.3g}); measure in {_name(stored)} "
                              "(--dtype)")
    model.to(dtype=dtype)
    relative = torch.finfo(dtype).eps / 2 if rounded else 0.0
    said = None
    if rounded:
        said = (f"{source} stores {_name(stored)} weights; measuring in {_name(dtype)} rounds {rounded} of its "
                f"tensors (relative {relative:.1e}); --dtype {_name(stored)} keeps them as stored")
        warnings.warn(said, stacklevel=3)
    return {"stored_dtype": _name(stored) if stored is not None else None, "dtype": _name(dtype),
            "rounded_tensors": rounded, "relative_rounding": relative, "warning": said}


def _name(dtype: torch.dtype | None) -> str:
    return str(dtype).removeprefix("torch.")


def _strip_fitting_prefix(loaded: LoadedCheckpoint, spec: ModelSpec, model: nn.Module
                          ) -> tuple[LoadedCheckpoint, ModelSpec]:
    """A prefix on every key whose removal makes the keys the model's exactly (a Lightning
    .ckpt's `model.`) is removed, said once on stderr and recorded as the resolved spec's
    checkpoint.strip_prefix, so that the report says how the weights were read."""
    prefix = fitting_prefix(loaded.state_dict, model)
    if prefix is None:
        return loaded, spec
    warnings.warn(f"{loaded.path}: every key carries the prefix {prefix!r} and fits the model without it; "
                  f"removed it (checkpoint.strip_prefix in the report's resolved spec)", stacklevel=3)
    origins = {**spec.origins, "checkpoint": "detected: every key of the checkpoint carries the prefix"}
    spec = replace(spec, checkpoint=CheckpointSpec(key=spec.checkpoint.key, strip_prefix=prefix), origins=origins)
    return replace(loaded, state_dict=strip_prefix(loaded.state_dict, prefix, loaded.path)), spec


def model_origin(spec: ModelSpec) -> str:
    """Which model a spec builds and where the spec came from, for an error about its weights."""
    where = spec.found or spec.origins.get("arch") or spec.where
    return f"{spec.source} {spec.arch!r} from {where}" + (" (--spec or --model chooses another)" if spec.found else "")


def load_model(model: str | None = None, checkpoint: str | os.PathLike | None = None, pretrained: bool = False,
               *, spec: str | os.PathLike | None = None, trust_packages: Sequence[str] = (), seed: int = 0,
               **fields: Any) -> tuple[nn.Module, ModelSpec]:
    """The module and its resolved spec, as the command line resolves them.

    model: "timm:NAME" (hf-hub:timm/… included), "torchvision:NAME" or "python:MODULE:FUNCTION";
    or spec=PATH (a YAML spec); or neither, when `checkpoint` says what it is (an embedded spec,
    STEM.yaml or spec.yaml beside it, a timm config.json). checkpoint: the weights; without it,
    pretrained=True takes the library's weights from the local cache (never downloaded), else
    the model keeps its random initialisation, drawn from `seed`. fields: spec fields that win over the rest
    (num_classes=10, input_size=(3, 32, 32), mean=…, std=…, loss=…, head=…, kwargs={…}).
    Paths are taken relative to the caller's working directory; the spec reports them absolute.
    The module is float32, on the CPU, in eval mode; spec.origins says where each field came from.
    """
    request = ModelRequest(
        checkpoint=_absolute(checkpoint), spec=_absolute(spec), model=model, pretrained=pretrained,
        random_init=checkpoint is None and not pretrained, fields=dict(fields),
    )
    resolved = resolve(request)
    module, full, _ = build_with_weights(resolved.spec, resolved.checkpoint, tuple(trust_packages), seed)
    return module, full


def _absolute(path: str | os.PathLike | None) -> Path | None:
    # abspath, not resolve: a symlink the caller chose stays the name reported
    return None if path is None else Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
