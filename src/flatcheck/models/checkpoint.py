"""Reading checkpoints safely and fitting them to a model, strictly.

Pickles are only ever opened with torch's weights-only unpickler: a checkpoint
is untrusted input and must never run code. Loading is strict because curvature
measured on a half-loaded model is a silent, plausible-looking wrong answer.
"""

from __future__ import annotations

import hashlib
import pickle
import pickletools
import re
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from flatcheck.errors import CheckpointError
from flatcheck.models.spec import CheckpointSpec

SAFETENSORS_EXTS = (".safetensors",)
# .ckpt: PyTorch Lightning's torch.save archive (its weights under state_dict, keys "model.…")
TORCH_EXTS = (".pt", ".pth", ".bin", ".ckpt")
# Precedence when a checkpoint wraps its weights: the weights being trained come
# first; an EMA copy is a different model, so it is only taken when it is the
# sole candidate (pick it explicitly with checkpoint.key otherwise).
NESTED_KEYS = ("state_dict", "model_state_dict", "model", "state_dict_ema", "model_ema", "ema")
# Wrappers whose prefix ends up on every key: DataParallel/DDP and torch.compile.
AUTO_PREFIXES = ("module.", "_orig_mod.")
_SHOW = 5


@dataclass(frozen=True)
class LoadedCheckpoint:
    state_dict: dict[str, Tensor]
    sha256: str
    path: Path
    format: str  # "safetensors" | "torch"
    # how the weights as stored became the run's dtype (models/load.py `_cast`), for the report:
    # a rounding said only on stderr would be lost under --quiet
    cast: dict[str, Any] | None = None


def load_checkpoint(path: str | Path, spec: CheckpointSpec = CheckpointSpec()) -> LoadedCheckpoint:
    """Read a checkpoint file and return its flat state dict.

    Selection: `spec.key` (dotted) if given. Otherwise a mapping whose entries
    include one of NESTED_KEYS holding tensors is unwrapped, first match in
    NESTED_KEYS order (state_dict, model_state_dict, model, then the EMA keys);
    failing that, the tensor entries of the top level are the weights.
    Non-tensor entries (epoch, optimizer config) are dropped.

    Keys: `spec.strip_prefix` is removed where present; a `module.` or
    `_orig_mod.` prefix carried by every key is removed automatically.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a folder, not a file; give the checkpoint file inside it")
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    suffix = path.suffix.lower()
    if suffix in SAFETENSORS_EXTS:
        obj, fmt = _read_safetensors(path), "safetensors"
    elif suffix in TORCH_EXTS:
        obj, fmt = _read_torch(path), "torch"
    else:
        allowed = ", ".join(SAFETENSORS_EXTS + TORCH_EXTS)
        raise CheckpointError(f"{path}: unsupported checkpoint extension {path.suffix!r}; allowed: {allowed}")
    state = _select(obj, spec, path)
    state = _strip_prefixes(state, spec.strip_prefix, path)
    return LoadedCheckpoint(state_dict=state, sha256=file_sha256(path), path=path, format=fmt)


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:
        raise CheckpointError(f"not a valid safetensors file: {path} ({_one_line(exc)})") from None


def _read_torch(path: Path) -> Any:
    try:
        with warnings.catch_warnings():
            # torch warns about pickle protocols it may not handle; the outcome is what matters.
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        needed = _code_in_pickle(path, exc)
        if needed is not None:
            what = f" (it needs {needed})" if needed else ""
            raise CheckpointError(
                f"refusing to execute pickled code in {path}; save a plain state_dict or use .safetensors{what}"
            ) from None
        # torch wraps the real reason in paragraphs of advice about weights_only.
        raise _not_torch(path, exc.__cause__ or exc.__context__ or exc) from None
    except Exception as exc:
        raise _not_torch(path, exc) from None


def _not_torch(path: Path, reason: BaseException) -> CheckpointError:
    # The weights-only unpickler reports a byte it does not know as a bare KeyError
    # ('101' for a text file), which says nothing to a reader.
    if not zipfile.is_zipfile(path) and _pickle_ops(path) is None:
        return CheckpointError(
            f"not a PyTorch checkpoint: {path} is neither a torch.save archive nor a pickle; "
            f"save the weights with torch.save(model.state_dict()) or use .safetensors"
        )
    return CheckpointError(f"not a valid PyTorch checkpoint: {path} ({_short(reason)})")


def _code_in_pickle(path: Path, exc: Exception) -> str | None:
    """Why the weights-only unpickler refused: a named global, or '' for code found
    by a static scan, or None when the bytes are simply not a pickle."""
    found = re.search(r"GLOBAL (\S+)", str(exc))
    if found:
        return found.group(1)
    # The unpickler also rejects opcodes it does not know (protocol 4+ pickles),
    # which hides whether the file would run code. pickletools only parses.
    ops = _pickle_ops(path)
    calls = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX"}
    return "" if ops is not None and ops & calls else None


def _pickle_ops(path: Path) -> set[str] | None:
    """Opcode names of the file's pickle (inside a torch.save zip or bare), or None
    when there is no pickle to parse."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                name = next(n for n in zf.namelist() if n.endswith("data.pkl"))
                data = zf.read(name)
        else:
            data = path.read_bytes()
        return {op.name for op, _, _ in pickletools.genops(data)}
    except Exception:
        return None


def _select(obj: Any, spec: CheckpointSpec, path: Path) -> dict[str, Tensor]:
    if not isinstance(obj, Mapping):
        raise CheckpointError(
            f"{path}: not a checkpoint: it holds {_kind(obj)}, where a mapping of parameter names to tensors "
            f"(a state_dict) was expected"
        )
    if spec.key:
        found = _walk(obj, spec.key, path)
    else:
        found = next((obj[k] for k in NESTED_KEYS if _holds_tensors(obj.get(k))), obj)
    tensors = {str(k): v for k, v in found.items() if isinstance(v, Tensor)}
    if not tensors:
        where = f"under key {spec.key!r} " if spec.key else ""
        raise CheckpointError(
            f"{path}: not a checkpoint: no tensors {where}found (top-level keys: {preview(list(obj)) or 'none'}); "
            f"if the weights are nested deeper, set checkpoint.key"
        )
    return tensors


def _holds_tensors(value: Any) -> bool:
    return isinstance(value, Mapping) and any(isinstance(v, Tensor) for v in value.values())


def _walk(obj: Mapping, key: str, path: Path) -> Mapping:
    parts, node, i = key.split("."), obj, 0
    while i < len(parts):
        # Longest match first: a literal key may itself contain dots.
        for j in range(len(parts), i, -1):
            part = ".".join(parts[i:j])
            if isinstance(node, Mapping) and part in node:
                node, i = node[part], j
                break
        else:
            raise CheckpointError(
                f"{path}: checkpoint.key {key!r} not found; top-level keys: {preview(list(obj))}"
            )
    if not isinstance(node, Mapping):
        raise CheckpointError(f"{path}: checkpoint.key {key!r} holds {type(node).__name__}, not a state dict")
    return node


def _strip_prefixes(state: dict[str, Tensor], prefix: str | None, path: Path) -> dict[str, Tensor]:
    if prefix:
        if not any(k.startswith(prefix) for k in state):
            raise CheckpointError(
                f"{path}: checkpoint.strip_prefix {prefix!r} matches no key; keys look like: {preview(list(state))}"
            )
        state = _rename(state, lambda k: k[len(prefix):] if k.startswith(prefix) else k, path)
    stripped = True
    while stripped:
        stripped = False
        for auto in AUTO_PREFIXES:
            if all(k.startswith(auto) for k in state):
                state = _rename(state, lambda k: k[len(auto):], path)
                stripped = True
    return state


def _rename(state: dict[str, Tensor], fn, path: Path) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        new = fn(key)
        if new in out:
            raise CheckpointError(f"{path}: two keys become {new!r} after stripping a prefix")
        out[new] = value
    return out


def fitting_prefix(state_dict: Mapping[str, Tensor], model: nn.Module) -> str | None:
    """The leading dotted components that every key carries and whose removal makes the keys
    exactly the model's (a LightningModule's `model.` on every key), or None. Only an exact
    fit counts: a prefix that leaves one key over or one missing is a hint, not a strip."""
    expected = model.state_dict()
    keys = list(state_dict)
    if not keys or _misfit(dict(state_dict), expected) == ([], []):
        return None
    parts = keys[0].split(".")
    for n in range(1, len(parts)):
        prefix = ".".join(parts[:n]) + "."
        if not all(k.startswith(prefix) for k in keys):
            return None
        if _misfit({k[len(prefix):]: v for k, v in state_dict.items()}, expected) == ([], []):
            return prefix
    return None


def strip_prefix(state_dict: dict[str, Tensor], prefix: str, path: Path) -> dict[str, Tensor]:
    return _rename(state_dict, lambda k: k[len(prefix):], path)


def _misfit(state: dict[str, Tensor], expected: dict[str, Tensor]) -> tuple[list[str], list[str]]:
    """(missing, unexpected) keys of `state` for a model whose state dict is `expected`, after
    filling the absences that lose nothing (fills `state` in place)."""
    _fill_tolerated(state, expected)
    return [k for k in expected if k not in state], [k for k in state if k not in expected]


def _prefix_hint(missing: list[str], unexpected: list[str]) -> str | None:
    """A prefix that the unexpected keys carry and that, removed, gives missing keys: the
    checkpoint.strip_prefix to set (the keys it leaves unexpected stay named above)."""
    wanted = set(missing)
    best, matched = None, 0
    for prefix in {k[:k.index(".") + 1] for k in unexpected if "." in k}:
        n = sum(k.startswith(prefix) and k[len(prefix):] in wanted for k in unexpected)
        if n > matched:
            best, matched = prefix, n
    if best is None:
        return None
    return (f"{matched} of the {len(missing)} missing keys are there with the prefix {best!r}: "
            f"--set checkpoint.strip_prefix={best} removes it")


def apply_state_dict(model: nn.Module, state_dict: dict[str, Tensor], *, source: str = "checkpoint",
                     model_from: str | None = None) -> None:
    """Load `state_dict` into `model` exactly, or raise one CheckpointError saying
    everything that does not fit (and, `model_from`, which spec built the model). Values are
    cast to the model's dtypes."""
    expected = model.state_dict()
    state = dict(state_dict)
    missing, unexpected = _misfit(state, expected)
    mismatched = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in expected
        if k in state and tuple(state[k].shape) != tuple(expected[k].shape)
    ]
    problems = [
        f"{label} {len(items)} ({preview(items)})"
        for label, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", mismatched))
        if items
    ]
    if problems:
        hint = _prefix_hint(missing, unexpected) if missing and unexpected else None
        told = [*problems, *([hint] if hint else []), *([f"the model is {model_from}"] if model_from else [])]
        raise CheckpointError(f"{source} does not fit the model: " + "; ".join(told))
    _refuse_integer_weights(state, expected, source)

    # Cast before checking: a float64 value beyond float32's range becomes inf.
    cast = {k: v.detach().to(device="cpu", dtype=expected[k].dtype) for k, v in state.items()}
    bad = [
        k for k, v in cast.items()
        if (v.is_floating_point() or v.is_complex()) and not bool(torch.isfinite(v).all())
    ]
    if bad:
        raise CheckpointError(f"{source} has non-finite values (NaN/Inf) in {len(bad)} tensors: {preview(bad)}")
    try:
        model.load_state_dict(cast, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{source} could not be loaded: {_short(exc)}") from None


def _refuse_integer_weights(state: dict[str, Tensor], expected: dict[str, Tensor], source: str) -> None:
    """A float tensor of the model stored as integers is quantised or corrupt; casting it
    would measure a different network. Integer buffers (num_batches_tracked) match in kind."""
    bad = [
        f"{k} ({str(state[k].dtype).removeprefix('torch.')})"
        for k, v in expected.items()
        if (v.is_floating_point() or v.is_complex()) and not (state[k].is_floating_point() or state[k].is_complex())
    ]
    if bad:
        raise CheckpointError(
            f"{source} stores {len(bad)} floating-point tensors of the model as integers: {preview(bad)}; "
            f"save the float weights (quantised checkpoints are not supported)"
        )


def _fill_tolerated(state: dict[str, Tensor], expected: dict[str, Tensor]) -> None:
    """Complete keys whose absence loses nothing: BatchNorm step counters, and
    tied parameters that serialisers (safetensors' save_model) store once."""
    by_storage: dict[tuple[int, tuple[int, ...]], list[str]] = {}
    for key, value in expected.items():
        if value.numel() > 0:
            by_storage.setdefault((value.data_ptr(), tuple(value.shape)), []).append(key)
    for key, value in expected.items():
        if key in state:
            continue
        if key.endswith("num_batches_tracked"):
            state[key] = value
            continue
        twins = by_storage.get((value.data_ptr(), tuple(value.shape)), [])
        present = next((t for t in twins if t in state), None)
        if present is not None:
            state[key] = state[present]


def _kind(obj: Any) -> str:
    if isinstance(obj, Tensor):
        return f"a single tensor of shape {tuple(obj.shape)}"
    if isinstance(obj, (list, tuple)):
        return f"a {type(obj).__name__} of {len(obj)} items"
    return f"a {type(obj).__name__}"


def preview(items: list) -> str:
    items = [str(i) for i in items]  # checkpoints may have non-string keys (ints)
    head = ", ".join(items[:_SHOW])
    return head if len(items) <= _SHOW else f"{head}, ... and {len(items) - _SHOW} more"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    # a bare message ("'101'" from a KeyError) only makes sense with its type
    return text if " " in text else f"{type(exc).__name__}: {text}".rstrip(": ")


def _short(exc: BaseException, limit: int = 160) -> str:
    text = _one_line(exc).split(". ")[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."
