"""Where model architectures come from: a small registry of builders.

A builder turns a validated `ModelSpec` into a randomly initialised module;
the weights always come from the user's checkpoint, never from a download.
Each source may also supply preprocessing defaults (timm's data config,
torchvision's weight transforms) that the spec can override field by field.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.machinery
import importlib.util
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

import torch
from torch import nn

from flatcheck.data.preprocess import Preprocess
from flatcheck.errors import InputError, SpecError
from flatcheck.models.outputs import attach_output_selector
from flatcheck.models.registry import get_source, list_sources, register_source
from flatcheck.models.spec import ModelSpec, field_words

__all__ = ["build_model", "complete_spec", "find_head", "list_sources", "register_source", "resolve_preprocess"]


def build_model(spec: ModelSpec, *, trust_packages: Sequence[str] = ()) -> nn.Module:
    """Randomly initialised model for `spec`: float32, on CPU, in eval mode, whose
    forward returns plain logits (see `outputs`: names stay as the model has them).

    trust_packages: packages a `source: python` spec may import beyond the
    built-in TRUSTED_PACKAGES (the --trust-package flag).
    """
    source = get_source(spec.source)
    if source is None:
        raise SpecError(f"{spec.where}: field 'source' must be one of {', '.join(list_sources())}, got {spec.source!r}")
    # python is the one source that imports what the spec names, so only it needs the trust list
    model = _build_python(spec, tuple(trust_packages)) if spec.source == "python" else source.build(spec)
    if not isinstance(model, nn.Module):
        raise SpecError(f"{spec.where}: field 'arch' {spec.arch!r} returned {type(model).__name__}, not a torch.nn.Module")
    attach_output_selector(model, spec.output_key, spec.where)
    return model.to(device="cpu", dtype=torch.float32).eval()


def resolve_preprocess(spec: ModelSpec, model: nn.Module) -> Preprocess:
    """Input contract: the spec's own fields, then the source's defaults."""
    base = _library_defaults(spec, model)
    input_size = spec.input_size or base.input_size
    mean, std = (spec.mean, spec.std) if spec.mean is not None else (base.mean, base.std)
    if mean is not None and input_size is not None and len(input_size) == 3 and len(mean) != input_size[0]:
        raise SpecError(
            f"{spec.where}: default mean/std of {spec.arch!r} have {len(mean)} channels but input_size "
            f"{list(input_size)} has {input_size[0]}; set fields 'mean' and 'std'"
        )
    came = spec.origins.get("mean", "spec") if spec.mean is not None else f"{spec.source}'s defaults for {spec.arch}"
    return Preprocess(input_size=input_size, mean=mean, std=std, interpolation=base.interpolation,
                      normalisation_from=came)


def _library_defaults(spec: ModelSpec, model: nn.Module) -> Preprocess:
    source = get_source(spec.source)
    return source.defaults(spec, model) if source and source.defaults else Preprocess()


_LIBRARY = {"timm": "library metadata (timm pretrained_cfg)",
            "torchvision": "library metadata (torchvision weights meta)"}


def complete_spec(spec: ModelSpec, model: nn.Module) -> ModelSpec:
    """The spec with every field the run uses filled in, and where each came from: the input
    contract and class count from the library's own metadata where the spec leaves them unset,
    and the head as detected. Filling changes no number: these are the values the run would
    have used anyway (resolve_preprocess, the model's own width, find_head)."""
    origins = dict(spec.origins) or {f: "default" for f in ("input_size", "mean", "std", "num_classes", "head")}
    library = _LIBRARY.get(spec.source, f"source {spec.source} defaults")
    filled: dict[str, object] = {}
    pre = resolve_preprocess(spec, model)
    if spec.input_size is None and pre.input_size is not None:
        filled["input_size"] = pre.input_size
    if spec.mean is None and pre.mean is not None:
        filled.update(mean=pre.mean, std=pre.std)
    width = _library_classes(spec, model)
    if spec.num_classes is None and width is not None:
        filled["num_classes"] = width
    for name in filled:
        origins[name] = library
    if spec.head is None:
        try:
            filled["head"] = find_head(model, spec)
            origins["head"] = "detected (the final linear layer)"
        except SpecError:  # reported by the probes that need a head, not by every run
            pass
    return replace(spec, **filled, origins=origins)


def _library_classes(spec: ModelSpec, model: nn.Module) -> int | None:
    """The class count the library gives the model when the spec names none (timm's
    num_classes attribute; torchvision's classifier width, from its weights' categories)."""
    if spec.source == "timm":
        width = getattr(model, "num_classes", None)
        return width if isinstance(width, int) and width > 0 else None
    if spec.source == "torchvision":
        from torchvision.models import get_model_weights

        try:
            return len(get_model_weights(spec.arch).DEFAULT.meta["categories"])
        except Exception:  # no weights enum for this arch: nothing the library says
            return None
    return None


def find_head(model: nn.Module, spec: ModelSpec, named: str | None = None) -> str:
    """Dotted name of the final linear layer (nn.Linear or a 1x1 nn.Conv2d). `named`: how
    messages name where spec.head came from, when not the spec's own field (a probe's option)."""
    modules = dict(model.named_modules())
    if spec.head is not None:
        module = modules.get(spec.head)
        who = named or f"{spec.where}: {field_words(spec.where, 'head')}"
        if module is None:
            candidates = [n for n, m in modules.items() if _is_head(m)][-5:]
            raise SpecError(
                f"{who} names no module of {spec.arch!r}: {spec.head!r}; "
                f"linear layers near the end: {', '.join(candidates) or 'none'}"
            )
        if not _is_head(module):
            raise SpecError(
                f"{who} must name an nn.Linear or 1x1 nn.Conv2d, but {spec.head!r} is {type(module).__name__}"
            )
        name = spec.head
    else:
        name = _detect_head(model, spec, modules)
    _check_width(spec, name, modules[name])
    return name


def _is_head(module: nn.Module) -> bool:
    if isinstance(module, nn.Linear):
        return True
    return isinstance(module, nn.Conv2d) and tuple(module.kernel_size) == (1, 1)


def _detect_head(model: nn.Module, spec: ModelSpec, modules: dict[str, nn.Module]) -> str:
    if spec.source == "timm" and hasattr(model, "get_classifier"):
        classifier = model.get_classifier()
        for name, module in modules.items():
            if module is classifier and _is_head(module):
                return name
    linears = [n for n, m in modules.items() if isinstance(m, nn.Linear)]
    # torchvision classifiers are Linear except SqueezeNet's 1x1 conv, so a conv
    # is only a fallback there; for python models either kind counts in order.
    if spec.source == "torchvision" and linears:
        return linears[-1]
    heads = [n for n, m in modules.items() if _is_head(m)]
    if not heads:
        raise SpecError(
            f"{spec.where}: cannot find the final linear layer of {spec.arch!r}; set {field_words(spec.where, 'head')} "
            f"to its module name"
        )
    return heads[-1]


def _check_width(spec: ModelSpec, name: str, module: nn.Module) -> None:
    # A head that does not emit num_classes outputs means the wrong layer was
    # picked (or the callable ignored num_classes); curvature would be wrong.
    width = module.out_features if isinstance(module, nn.Linear) else module.out_channels
    if spec.num_classes is not None and width != spec.num_classes:
        raise SpecError(
            f"{spec.where}: head {name!r} of {spec.arch!r} has {width} outputs but num_classes is "
            f"{spec.num_classes}; set {field_words(spec.where, 'head')} or fix {field_words(spec.where, 'num_classes')}"
        )


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _construct(spec: ModelSpec, fn: Callable[..., nn.Module], **fixed) -> nn.Module:
    if spec.num_classes is not None:
        fixed["num_classes"] = spec.num_classes
    try:
        return fn(**fixed, **spec.kwargs)
    except InputError:
        raise
    except TypeError as exc:
        raise SpecError(f"{spec.where}: fields 'kwargs'/'num_classes' rejected by {spec.arch!r} ({_one_line(exc)})") from None
    # The builder is the user's code (or a library's, fed the user's kwargs): whatever it
    # raises, even sys.exit, is a spec that cannot be built, not a flatcheck bug.
    except (Exception, SystemExit) as exc:
        raise SpecError(f"{spec.where}: field 'arch': builder {spec.arch!r} failed ({_one_line(exc)})") from None


def check_known_arch(spec: ModelSpec) -> None:
    """A timm or torchvision name that the library does not have, refused from the name alone
    (no model is built): for a command that builds its models later, in child processes."""
    if spec.source == "timm":
        import timm

        if not timm.is_model(spec.arch):
            raise _unknown_arch(spec, timm.list_models())
    elif spec.source == "torchvision":
        import torchvision

        known = torchvision.models.list_models()
        if spec.arch not in known:
            raise _unknown_arch(spec, known)


def _unknown_arch(spec: ModelSpec, known: list[str]) -> SpecError:
    close = difflib.get_close_matches(spec.arch, known, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return SpecError(f"{spec.where}: field 'arch': unknown {spec.source} model {spec.arch!r}{hint}")


# --- timm -------------------------------------------------------------------


def _timm_defaults(spec: ModelSpec, model: nn.Module) -> Preprocess:
    from timm.data import resolve_data_config

    cfg = resolve_data_config({}, model=model)
    return Preprocess(
        input_size=tuple(cfg["input_size"]),
        mean=tuple(float(x) for x in cfg["mean"]),
        std=tuple(float(x) for x in cfg["std"]),
        interpolation=str(cfg.get("interpolation", "bilinear")),
    )


@register_source("timm", defaults=_timm_defaults)
def _build_timm(spec: ModelSpec) -> nn.Module:
    import timm

    check_known_arch(spec)
    # Curvature products differentiate twice, and timm's fused CPU attention kernel has no
    # double backward (torch 2.14: "derivative for ..._flash_attention_for_cpu_backward is
    # not implemented"); the unfused path computes the same attention.
    from timm.layers import set_fused_attn

    set_fused_attn(False)
    return _construct(spec, timm.create_model, model_name=spec.arch, pretrained=False)


# --- torchvision ------------------------------------------------------------


def _torchvision_defaults(spec: ModelSpec, model: nn.Module) -> Preprocess:
    from torchvision.models import get_model_weights

    try:
        # Only the enum's metadata is read; no weights are fetched.
        transforms = get_model_weights(spec.arch).DEFAULT.transforms()
    except Exception:  # no weights enum for this arch: nothing to default to
        return Preprocess()
    mean, std = getattr(transforms, "mean", None), getattr(transforms, "std", None)
    crop = getattr(transforms, "crop_size", None)
    interpolation = getattr(transforms, "interpolation", None)
    return Preprocess(
        input_size=(3, crop[0], crop[-1]) if crop else None,
        mean=tuple(float(x) for x in mean) if mean else None,
        std=tuple(float(x) for x in std) if std else None,
        interpolation=getattr(interpolation, "value", "bilinear"),
    )


@register_source("torchvision", defaults=_torchvision_defaults)
def _build_torchvision(spec: ModelSpec) -> nn.Module:
    import torchvision

    check_known_arch(spec)
    return _construct(spec, torchvision.models.get_model, name=spec.arch, weights=None)


# --- python -----------------------------------------------------------------

# Importing a module runs its code, so a `source: python` spec may name only these
# (and their submodules), a file in the spec's own folder, or a --trust-package.
TRUSTED_PACKAGES = ("flatcheck.zoo", "timm", "torchvision")


@register_source("python")
def _build_python_untrusted(spec: ModelSpec) -> nn.Module:
    return _build_python(spec, ())


def _build_python(spec: ModelSpec, trust_packages: tuple[str, ...]) -> nn.Module:
    return _construct(spec, _import_callable(spec, ImportPolicy.of(spec, trust_packages)))


@dataclass(frozen=True)
class ImportPolicy:
    """What `arch: MODULE:CALLABLE` may import, decided from names alone.

    MODULE is looked up first as MODULE.py (or a package folder) in the spec's
    own folder — for `--model python:…`, which has no spec file, the working directory
    the user typed it in; otherwise it must lie in a trusted package. A spec embedded in a
    checkpoint has no folder of its own and trusts only --trust-package names. A spec found
    beside a checkpoint (not typed as --spec) came with the checkpoint, perhaps in a download:
    a module in its folder runs only when --trust-package names it.
    """

    where: str
    folder: Path | None
    packages: tuple[str, ...]
    embedded: bool
    place: str = "the spec's folder"  # how messages name `folder`
    found: str | None = None  # a discovered spec: how it was found (ModelSpec.found)
    told: tuple[str, ...] = ()  # the --trust-package names, which alone open a discovered spec's folder

    @classmethod
    def of(cls, spec: ModelSpec, trust_packages: tuple[str, ...]) -> "ImportPolicy":
        if spec.embedded:
            # the working directory, not the checkpoint's folder (a download's): a module named
            # with --trust-package may be a file where the user runs, as `python -m` finds it
            return cls(spec.where, Path.cwd().resolve(), trust_packages, True, "the working directory")
        packages = (*TRUSTED_PACKAGES, *trust_packages)
        if spec.path is None and spec.folder is not None:
            return cls(spec.where, spec.folder.resolve(), packages, False, f"the working directory {spec.folder}")
        folder = spec.path.resolve().parent if spec.path is not None else None
        return cls(spec.where, folder, packages, False, found=spec.found if spec.discovered else None,
                   told=trust_packages)

    def trusted_name(self, name: str) -> bool:
        return any(name == p or name.startswith(p + ".") for p in self.packages)

    def local(self, name: str) -> bool:
        """Whether MODULE's top-level name is a file or package in the spec's folder."""
        return self.local_spec(name) is not None

    def local_spec(self, name: str) -> importlib.machinery.ModuleSpec | None:
        """Where MODULE's top-level name lies in the spec's folder, found without importing it."""
        if self.folder is None:
            return None
        return importlib.machinery.PathFinder.find_spec(name.partition(".")[0], [str(self.folder)])

    def loaded_from_folder(self, module: ModuleType) -> bool:
        file = getattr(module, "__file__", None)
        return self.folder is not None and file is not None and Path(file).resolve().is_relative_to(self.folder)

    def check_module_name(self, name: str) -> None:
        """Refuse, before any import, a module the spec may not run."""
        if self.embedded:
            if self.trusted_name(name):
                return
            raise SpecError(
                f"{self.where}: field 'arch': a spec embedded in a checkpoint names python module {name!r}; "
                f"refusing to import it (a python spec runs code): pass --trust-package {name.partition('.')[0]} "
                "if you trust it"
            )
        if self.local(name):
            self._check_discovered(name)
            loaded = sys.modules.get(name.partition(".")[0])
            if loaded is not None and not self.loaded_from_folder(loaded):
                raise SpecError(
                    f"{self.where}: field 'arch': module {name!r} in {self.place} has the name of one "
                    f"already loaded from elsewhere ({getattr(loaded, '__file__', None) or 'built in'}); rename the file"
                )
            return
        if self.trusted_name(name):
            return
        top = name.partition(".")[0]
        raise SpecError(
            f"{self.where}: field 'arch': refusing to import {name!r} (a python spec runs code): only a .py file "
            f"in {self.place}, {', '.join(TRUSTED_PACKAGES)} or a --trust-package are imported; "
            f"pass --trust-package {top} if you trust it"
        )

    def _check_discovered(self, name: str) -> None:
        """A module beside a spec the user did not name runs only when --trust-package names it."""
        top = name.partition(".")[0]
        if self.found is None or any(name == p or name.startswith(p + ".") or p == top for p in self.told):
            return
        spot = self.local_spec(name)
        file = (list(spot.submodule_search_locations)[0] if spot.submodule_search_locations else spot.origin
                ) if spot is not None else top
        raise SpecError(
            f"{self.found}: field 'arch': refusing to import {name!r} from {file} (a spec found beside a "
            f"checkpoint, not given with --spec, runs no code of its folder unless told): pass --trust-package "
            f"{top} if you trust it, or name the spec with --spec"
        )

    def check_callable(self, target: Any, arch: str) -> None:
        """Refuse a callable defined outside what may run, though reached through an allowed
        module: `mymodel:os.system` or a trusted file's `from subprocess import getoutput`."""
        name = getattr(target, "__module__", None)
        name = name if isinstance(name, str) else ""
        module = sys.modules.get(name)
        if self.trusted_name(name) or (module is not None and self.loaded_from_folder(module)):
            return
        raise SpecError(
            f"{self.where}: field 'arch': {arch!r} is defined in module {name or 'unknown'!r}, which is not "
            f"trusted (a python spec runs code); pass --trust-package {name.partition('.')[0] or 'NAME'} "
            f"if you trust it"
        )


def local_module_path(spec: ModelSpec) -> Path | None:
    """The file (or package folder) a `source: python` spec imports from its own folder, found
    without importing it; None for other sources and for modules imported from elsewhere."""
    if spec.source != "python" or ":" not in spec.arch:
        return None
    found = ImportPolicy.of(spec, ()).local_spec(spec.arch.partition(":")[0])
    if found is None:
        return None
    if found.submodule_search_locations:
        return Path(list(found.submodule_search_locations)[0])
    return Path(found.origin) if found.origin else None


def _import_callable(spec: ModelSpec, policy: ImportPolicy) -> Callable[..., nn.Module]:
    module_name, _, attr_path = spec.arch.partition(":")
    if not module_name or not attr_path:
        raise SpecError(f"{spec.where}: field 'arch' must be 'module.path:callable', got {spec.arch!r}")
    policy.check_module_name(module_name)
    module = _import(spec, module_name, policy)
    target: Any = module
    for part in attr_path.split("."):
        # dunders reach interpreter internals (__builtins__, __globals__) rather than a model
        if part.startswith("__") or not hasattr(target, part):
            raise SpecError(f"{spec.where}: field 'arch': module {module_name!r} has no attribute {attr_path!r}")
        target = getattr(target, part)
    if not callable(target):
        raise SpecError(f"{spec.where}: field 'arch': {spec.arch!r} is not callable")
    policy.check_callable(target, spec.arch)
    return target


def _import(spec: ModelSpec, module_name: str, policy: ImportPolicy) -> ModuleType:
    # A model file kept next to its spec must import without installing it. An embedded spec's
    # trusted module comes from the installed packages first, the working directory after.
    local = policy.local(module_name) and not (
        policy.embedded and importlib.util.find_spec(module_name.partition(".")[0]) is not None)
    extra = str(policy.folder) if local else None
    added = extra is not None and extra not in sys.path
    if added:
        sys.path.insert(0, extra)
    try:
        return importlib.import_module(module_name)
    except Exception as exc:  # user code: any failure is a spec problem
        raise SpecError(f"{spec.where}: field 'arch': cannot import {module_name!r} ({_one_line(exc)})") from None
    finally:
        if added:
            sys.path.remove(extra)
