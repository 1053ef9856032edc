"""Every built-in data source: one registered factory each.

Nothing is ever downloaded: torchvision sources are opened with download=False and a
missing file is a DataError that names the expected path and how to fetch it once
elsewhere. Sources keep their samples compact (uint8 where the files are uint8) and
scale to [0, 1] per item, the way torchvision's to_tensor does (x.float() / 255).
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from flatcheck.data.catalogue import DataSource, MissingSplitError, register_dataset
from flatcheck.data.roots import ROOT_HELP, download_hint, missing_files
from flatcheck.data.transform import sample_dtype
from flatcheck.errors import DataError, InternalError

_ROOT_HELP = ROOT_HELP


class ArrayDataset(Dataset):
    """Samples held in one tensor; integer pixels are divided by `divisor` per item."""

    def __init__(self, x: Tensor, y: Tensor, divisor: float | None = None) -> None:
        if len(x) != len(y):
            raise InternalError(f"ArrayDataset: {len(x)} samples but {len(y)} labels")
        self.x, self.y, self.divisor = x, y.to(torch.int64), divisor

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        x = self.x[index].to(sample_dtype(self.x))
        if self.divisor is not None:
            x = x.div(self.divisor)
        return x, int(self.y[index])

    def items(self, start: int, stop: int) -> tuple[Tensor, Tensor]:
        """Samples start … stop − 1 at once, each as __getitem__ gives it: (B, …) float32 (float64
        for float64 samples) and (B,) int64 labels, new tensors (not views of the data set's)."""
        x = self.x[start:stop].to(sample_dtype(self.x), copy=True)
        if self.divisor is not None:
            x = x.div(self.divisor)
        return x, self.y[start:stop].clone()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _need_root(name: str, root: Path | None, expected: str, how: str) -> Path:
    if root is None:
        raise DataError(f"data '{name}' needs a data root containing {expected}: {how}, {_ROOT_HELP}")
    return root


# ---------------------------------------------------------------- CIFAR-10 / CIFAR-100


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles CIFAR batch files, refusing every global but numpy's array rebuilders.

    The CIFAR "python version" files are pickles, and a plain pickle.load of a file
    under a user-supplied root would run whatever code it names.
    """

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),  # how Python 3 pickles bytes at protocol 2
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")
        if module == "_codecs":
            import codecs

            return codecs.encode
        if name == "_reconstruct":
            core = getattr(np, "_core", None) or np.core  # numpy 2 renamed core
            return core.multiarray._reconstruct
        return getattr(np, name)


def _read_cifar_file(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as fh:
            # latin1 is what decodes the Python 2 str buffers of the official files
            entry = _CifarUnpickler(fh, encoding="latin1").load()
    except Exception as exc:  # any parse failure means the same thing to the user
        raise DataError(f"{path}: not a CIFAR python batch file ({_first_line(exc)})") from None
    if not isinstance(entry, dict):
        raise DataError(f"{path}: expected a pickled dict, got {type(entry).__name__}")
    # files written from Python 3 may carry bytes keys (b"data"), the official ones str
    entry = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in entry.items()}
    for key in ("data", label_key):
        if key not in entry:
            raise DataError(f"{path}: missing key '{key}' (found {sorted(map(str, entry))})")
    data = entry["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"{path}: 'data' must be a uint8 array of shape (n, 3072), got {got}")
    labels = np.asarray(entry[label_key], dtype=np.int64).reshape(-1)
    if len(labels) != len(data):
        raise DataError(f"{path}: {len(data)} images but {len(labels)} '{label_key}'")
    return data, labels


_CIFAR = {
    # name: (title, folder, train files, test files, label key, classes, torchvision class)
    "cifar10": ("CIFAR-10", "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"],
                "labels", 10, "CIFAR10"),
    "cifar100": ("CIFAR-100", "cifar-100-python", ["train"], ["test"], "fine_labels", 100, "CIFAR100"),
}


def _cifar(name: str, root: Path | None, split: str) -> DataSource:
    """Read CIFAR from torchvision's on-disk layout with flatcheck's own small reader.

    torchvision.datasets.CIFAR10 is not used because (1) it md5-checks every batch file,
    so any copy that is not byte-identical to the official release (a subset, a re-pickled
    file) is refused as "corrupted"; (2) it runs an unrestricted pickle.load on files under
    a user-given root; (3) it only understands str keys, not the b"data" keys a Python 3
    writer produces. Files are instead checked to exist and to parse into the expected
    structure, which catches truncation and corruption as well as the md5 would.
    The layout, file order, label key and pixel order are exactly torchvision's.
    """
    title, folder, train_files, test_files, label_key, classes, tv_class = _CIFAR[name]
    root = _need_root(name, root, f"{folder}/", download_hint(tv_class))
    base = root / folder
    split = "train" if split == "train" else "test"
    problem = missing_files(name, root, split)  # the check the CLI makes before torch, in its words
    if problem is not None:
        raise MissingSplitError(problem)
    parts = [_read_cifar_file(base / fname, label_key) for fname in (train_files if split == "train" else test_files)]
    data = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise DataError(f"data '{name}': labels under {base} must lie in 0..{classes - 1}")
    # rows are 1024 R, then G, then B values: a plain reshape gives (C, H, W)
    x = torch.from_numpy(data.reshape(-1, 3, 32, 32).copy())
    return DataSource(ArrayDataset(x, torch.from_numpy(labels), 255.0), classes,
                      f"{title} {split} split from {base}")


@register_dataset("cifar10")
def cifar10(*, root: Path | None, split: str, **_: Any) -> DataSource:
    return _cifar("cifar10", root, split)


@register_dataset("cifar100")
def cifar100(*, root: Path | None, split: str, **_: Any) -> DataSource:
    return _cifar("cifar100", root, split)


# ---------------------------------------------------------------- MNIST / Fashion-MNIST


def _mnist(name: str, title: str, tv_name: str, root: Path | None, split: str) -> DataSource:
    """torchvision's own MNIST reader; it checks only that the raw idx files exist (no md5).

    torchvision wants all four uncompressed idx files in <root>/<Class>/raw, whichever
    split is read (or its legacy processed/*.pt files), so they are all checked up front
    to name what is missing.
    """
    import torchvision.datasets as tvd

    cls = getattr(tvd, tv_name)
    root = _need_root(name, root, f"{tv_name}/raw/", download_hint(tv_name))
    raw = root / tv_name / "raw"
    problem = missing_files(name, root, split)  # the check the CLI makes before torch, in its words
    if problem is not None:
        raise DataError(problem)
    try:
        ds = cls(str(root), train=(split == "train"), download=False)
    except Exception as exc:  # torchvision raises assorted types for truncated idx files
        raise DataError(f"data '{name}': cannot read the idx files in {raw} ({_first_line(exc)})") from None
    x, y = ds.data, ds.targets.to(torch.int64)
    if x.dim() != 3 or len(x) != len(y):
        raise DataError(f"data '{name}': {raw} holds {tuple(x.shape)} images for {len(y)} labels")
    return DataSource(ArrayDataset(x.unsqueeze(1), y, 255.0), 10, f"{title} {split} split from {raw}")


@register_dataset("mnist")
def mnist(*, root: Path | None, split: str, **_: Any) -> DataSource:
    return _mnist("mnist", "MNIST", "MNIST", root, split)


@register_dataset("fashion-mnist")
def fashion_mnist(*, root: Path | None, split: str, **_: Any) -> DataSource:
    return _mnist("fashion-mnist", "Fashion-MNIST", "FashionMNIST", root, split)


# ---------------------------------------------------------------- SVHN


@register_dataset("svhn")
def svhn(*, root: Path | None, split: str, **_: Any) -> DataSource:
    """torchvision's SVHN reader (scipy loadmat, label 10 -> 0) with the md5 check reduced
    to existence, for the same reason as CIFAR: a non-official copy is not corrupt, and
    loadmat fails loudly on a damaged file."""
    import torchvision.datasets as tvd

    class _SVHN(tvd.SVHN):
        def _check_integrity(self) -> bool:
            return os.path.isfile(os.path.join(self.root, self.filename))

    fname = tvd.SVHN.split_list[split][1]
    root = _need_root("svhn", root, fname, download_hint("SVHN", f"split={split!r}, "))
    problem = missing_files("svhn", root, split)  # the check the CLI makes before torch, in its words
    if problem is not None:
        raise MissingSplitError(problem)
    try:
        ds = _SVHN(str(root), split=split, download=False)
    except Exception as exc:
        raise DataError(f"data 'svhn': cannot read {root / fname} ({_first_line(exc)})") from None
    x = torch.from_numpy(np.ascontiguousarray(ds.data))
    if x.dim() != 4 or x.shape[1] != 3 or x.dtype != torch.uint8:
        raise DataError(f"data 'svhn': {root / fname} holds {x.dtype} {tuple(x.shape)}; expected uint8 32x32x3xN")
    desc = f"SVHN {split} split from {root / fname}"
    return DataSource(ArrayDataset(x, torch.from_numpy(ds.labels), 255.0), 10, desc)


# ---------------------------------------------------------------- image folders


class ImageFiles(Dataset):
    """Labelled image files decoded per item to PIL `mode` ("L" or "RGB"), scaled to [0, 1].

    Decoding is flatcheck's own rather than torchvision's ImageFolder loader so that a file
    that cannot be decoded is a DataError naming it, not an exception from deep in PIL.
    """

    def __init__(self, samples: list[tuple[Path, int]], mode: str, where: str) -> None:
        self.samples, self.mode, self.where = samples, mode, where
        self.channel_conversion = self._conversion()

    def _conversion(self) -> str | None:
        """What convert(mode) does to the first image's channels, for the report (a folder is
        taken to hold one kind of image; a file that cannot be read fails when it is read)."""
        from PIL import Image

        from .transform import channel_conversion

        try:
            with Image.open(self.samples[0][0]) as img:  # reads the header only
                bands = len(img.getbands()) - ("A" in img.getbands())
        except Exception:
            return None
        return channel_conversion(bands, len(self.mode)) if bands in (1, 3) else None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        from PIL import Image

        path, label = self.samples[index]
        try:
            with Image.open(path) as img:
                pixels, top = _pixels(img, self.mode)
        except DataError as exc:
            raise DataError(f"{self.where}: image {path}: {exc}") from None
        except Exception as exc:  # truncation, garbage, a bad chunk: all mean an unreadable file
            raise DataError(f"{self.where}: cannot read image {path} ({_first_line(exc)})") from None
        x = torch.from_numpy(pixels.copy())
        x = x.unsqueeze(0) if x.dim() == 2 else x.permute(2, 0, 1)
        return x.float().div(top), label


# 16-bit grey images (PNG, TIFF) open in these modes; convert("L") would clip them at 255
_WIDE_GREY = {"I;16": 65535.0, "I;16L": 65535.0, "I;16B": 65535.0, "I;16N": 65535.0}


def _pixels(img: Any, mode: str) -> tuple[np.ndarray, float]:
    """An image's pixels in PIL `mode`'s channels, and the value of full scale at its bit depth."""
    depth = _WIDE_GREY.get(img.mode)
    if depth is None and img.mode == "I" and img.format == "PNG":
        depth = 65535.0  # a PNG holds at most 16 bits; older PIL opens 16-bit grey as "I"
    if depth is None:
        if img.mode in ("I", "F"):
            raise DataError(f"{'32-bit integer' if img.mode == 'I' else 'float'} pixels have no bit depth to "
                            "scale by; save it with 8 or 16 bits")
        return np.asarray(img.convert(mode)), 255.0  # convert() decodes the whole file
    grey = np.asarray(img).astype(np.float32)
    return (grey if mode == "L" else np.repeat(grey[..., None], 3, axis=2)), depth


def _hidden(name: str) -> bool:
    # .DS_Store, ._x.png resource forks, .ipynb_checkpoints/: tool litter, never data
    return name.startswith(".")


def _class_folders(folder: Path, where: str) -> list[str]:
    """The class folders' names, sorted: the labels. A link that leads nowhere is refused rather
    than skipped: it is most likely a class folder on a drive not mounted, and dropping it would
    shift the label of every class after it."""
    names = []
    for e in os.scandir(folder):
        if _hidden(e.name):
            continue
        if e.is_dir():
            names.append(e.name)
        elif e.is_symlink() and not os.path.exists(e.path):
            raise DataError(f"{where}: {e.path} is a link to {os.readlink(e.path)}, which does not exist; "
                            "expected a class folder of images there: mount or fix its target, or remove the link")
    return sorted(names)


class _FolderLinks:
    """The folders one imagefolder read goes through, each once: a folder symlink is followed
    only when it leads out of `tree` (the data folder), at any level (split, class, or below).
    One leading back into it would read another class's images (or its own, forever) again,
    and two links to one folder elsewhere would read its images twice."""

    def __init__(self, tree: Path, where: str) -> None:
        self.top = Path(os.path.realpath(tree))
        self.where = where
        self.seen: set[str] = set()

    def check(self, path: str | Path, record: bool = True) -> None:
        """Refuse `path` (a folder about to be read) when it is a link back into the data folder
        or the second way to one folder; `record`: count it as read."""
        path = str(path)
        real = os.path.realpath(path)
        if os.path.islink(path) and (Path(real).is_relative_to(self.top) or self.top.is_relative_to(real)):
            raise DataError(f"{self.where}: {path} is a link to folder {real}, inside the data folder: its images "
                            "would be read again (forever, for a folder above it); remove the link or copy the "
                            "images")
        if not record:
            return
        if real in self.seen:  # two links outside the tree that lead to each other, or to one folder
            raise DataError(f"{self.where}: {path} leads to folder {real} a second time (a symlink loop, or two "
                            "links to one folder); remove the link")
        self.seen.add(real)


def _image_files(class_dir: Path, links: _FolderLinks) -> list[Path]:
    """Image files under class_dir at any depth, skipping hidden files and folders,
    in torchvision ImageFolder's order (walk sorted by folder, then file name); every folder
    passes `links` (_FolderLinks) before it is read."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    links.check(class_dir)
    walked = []
    for root, dirs, names in os.walk(class_dir, followlinks=True):
        for name in dirs:
            links.check(os.path.join(root, name))
        walked.append((root, names))
    files = []
    for root, names in sorted(walked):
        if any(_hidden(part) for part in Path(root).relative_to(class_dir).parts):
            continue
        files += [Path(root) / n for n in sorted(names) if not _hidden(n) and n.lower().endswith(IMG_EXTENSIONS)]
    return files


_SPLIT_FOLDERS = ("train", "test", "val")


def _split_folders(base: Path, split: str, where: str) -> tuple[Path, Path, str]:
    """(folder to read, folder whose class folders define the labels, note) for `split`."""
    present = [s for s in _SPLIT_FOLDERS if (base / s).is_dir()]
    if not present:
        if split == "test":
            raise MissingSplitError(f"{where}: no test split: {base} has no test/ or val/ subfolder "
                            "(a folder of class folders is the train split only)")
        return base, base, " (a folder of class folders: the train split only)"
    label_dir = base / "train" if "train" in present else None
    if split == "train":
        if label_dir is None:
            raise MissingSplitError(f"{where}: no train split: expected {base / 'train'} (found {', '.join(present)}/)")
        return label_dir, label_dir, ""
    test = next((base / s for s in ("test", "val") if s in present), None)
    if test is None:
        raise MissingSplitError(f"{where}: no test split: expected {base / 'test'} or {base / 'val'} next to {label_dir}")
    return test, label_dir or test, ""


@register_dataset("imagefolder", takes_path=True)
def imagefolder(*, path: str, split: str, input_size: tuple[int, ...] | None = None, **_: Any) -> DataSource:
    """PATH/<class>/<image>; hidden files and folders (names starting with '.') are ignored.

    With a train/, test/ or val/ subfolder PATH is split-aware: train -> PATH/train, test ->
    PATH/test, else PATH/val. Class indices come from the sorted class folders of train/
    (when present), so a test folder lacking a class keeps the same labels. Without such
    subfolders PATH holds the train split only. Images are read as grey ("L") for a
    1-channel model and as RGB otherwise, as torchvision's Grayscale and ImageFolder do.
    """
    where = f"imagefolder:{path}"
    base = Path(path).expanduser()
    if not base.is_dir():
        raise DataError(f"{where}: folder {base} not found")
    folder, label_dir, note = _split_folders(base, split, where)
    links = _FolderLinks(base, where)
    try:
        for split_dir in {folder, label_dir} - {base}:
            links.check(split_dir, record=False)  # test/ linked to train/ would measure train as test
        class_to_idx = {c: i for i, c in enumerate(_class_folders(label_dir, where))}
        files = {c: _image_files(folder / c, links) for c in _class_folders(folder, where)}
    except OSError as exc:
        raise DataError(f"{where}: {_first_line(exc)}") from None
    unknown = [c for c in files if c not in class_to_idx]
    if unknown:
        raise DataError(f"{where}: {folder} has classes {unknown} that {label_dir} lacks")
    empty = [c for c, found in files.items() if not found]
    if empty:
        raise DataError(f"{where}: class folders {empty} in {folder} hold no image files")
    samples = [(f, class_to_idx[c]) for c, found in files.items() for f in found]
    mode = "L" if input_size is not None and len(input_size) == 3 and input_size[0] == 1 else "RGB"
    desc = f"{len(samples)} images in {len(class_to_idx)} classes from {folder}{note}"
    return DataSource(ImageFiles(samples, mode, where), len(class_to_idx), desc)


# ---------------------------------------------------------------- npz files


def _npz_images(arr: np.ndarray, where: str) -> tuple[Tensor, float | None]:
    """(N,D) vectors, (N,H,W) grey, (N,C,H,W); (N,H,W,C) with C in 1/3/4 is permuted.

    A trailing 1/3/4 axis is taken as channels only when axis 1 is not also a plausible
    channel count, so (N,3,32,32) and (N,32,32,3) both mean RGB 32x32.
    """
    if arr.dtype == np.uint8:
        divisor = 255.0
    elif np.issubdtype(arr.dtype, np.floating):
        # float64 stays float64 (ArrayDataset); float16 widens exactly to float32
        arr, divisor = (arr if arr.dtype == np.float64 else arr.astype(np.float32, copy=False)), None
        _check_unit_range(arr, where)
    else:
        raise DataError(f"{where}: must be uint8 (0..255) or float (0..1), got {arr.dtype}")
    if arr.ndim == 3:
        arr = arr[:, None]
    elif arr.ndim == 4 and arr.shape[-1] in (1, 3, 4) and arr.shape[1] not in (1, 3, 4):
        arr = arr.transpose(0, 3, 1, 2)
    elif arr.ndim not in (2, 4):
        raise DataError(f"{where}: expected shape (N,D), (N,H,W), (N,C,H,W) or (N,H,W,C), got {arr.shape}")
    return torch.from_numpy(np.ascontiguousarray(arr)), divisor


def _check_unit_range(arr: np.ndarray, where: str) -> None:
    """Float samples are taken as the [0, 1] values the spec's mean/std apply to: 0..255
    or already-normalised floats would reach the model unscaled and give plausible but
    wrong numbers. Non-finite values are left to the per-batch checks, which name the sample."""
    lo, hi = (arr.min(), arr.max()) if arr.size else (0.0, 0.0)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        finite = arr[np.isfinite(arr)]
        lo, hi = (finite.min(), finite.max()) if finite.size else (0.0, 0.0)
    if 0.0 <= lo and hi <= 1.0:
        return
    hint = ("values below 0 look normalised already: store the [0, 1] values (or uint8 0..255) and put "
            "the normalisation in the model spec's mean and std" if lo < 0 else
            "store 0..255 pixels as uint8 (or divide them by 255)")
    raise DataError(f"{where}: float values must lie in [0, 1], found {lo:.4g}..{hi:.4g}; {hint}")


def _npz_labels(arr: np.ndarray, n: int, where: str) -> np.ndarray:
    if not np.issubdtype(arr.dtype, np.integer) or arr.ndim != 1:
        raise DataError(f"{where}: expected integer class labels of shape (N,), got {arr.dtype} {arr.shape}")
    if len(arr) != n:
        raise DataError(f"{where}: {len(arr)} labels for {n} samples")
    if len(arr) and arr.min() < 0:
        raise DataError(f"{where}: labels must be >= 0, found {arr.min()}")
    return arr.astype(np.int64)


# (x, y) array names of each split; x_train/y_train is the layout of Keras's .npz files
_NPZ_KEYS = {"train": (("x", "y"), ("x_train", "y_train")), "test": (("x_test", "y_test"),)}
_NPZ_LABELS = ("y", "y_train", "y_test")


def _npz_keys(names: set[str], split: str, where: str) -> tuple[str, str]:
    """The (x, y) array names of `split`; DataError when the file has no such split."""
    found = f"found {', '.join(sorted(names)) or 'none'}"
    pairs = [pair for pair in _NPZ_KEYS[split] if set(pair) & names]
    if len(pairs) > 1:
        raise DataError(f"{where}: arrays {pairs[0]} and {pairs[1]} both look like the {split} split; keep one pair")
    if not pairs:
        expected = " or ".join(f"'{x}' and '{y}'" for x, y in _NPZ_KEYS[split])
        raise MissingSplitError(f"{where}: no {split} split: expected arrays {expected} ({found})")
    for key in pairs[0]:
        if key not in names:
            raise DataError(f"{where}: array '{key}' missing ({found})")
    return pairs[0]


@register_dataset("npz", takes_path=True)
def npz(*, path: str, split: str, **_: Any) -> DataSource:
    """Train split: arrays `x`, `y` (or `x_train`, `y_train`); test split: `x_test`, `y_test`.

    A file without test arrays has no test split. Pickled (object) arrays are refused.
    num_classes is max label + 1 over all label arrays, so both splits agree.
    """
    where = f"npz:{path}"
    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(f"{where}: file {file} not found")
    if not zipfile.is_zipfile(file):
        # np.load would try the bytes as a pickle and advise allow_pickle, which is no answer here
        raise DataError(f"{where}: {file} is not an .npz archive (the zip of arrays numpy.savez writes, with "
                        "x and y)")
    try:
        with np.load(file, allow_pickle=False) as z:
            xk, yk = _npz_keys(set(z.files), split, where)
            x_arr, y_arr = z[xk], z[yk]
            other_labels = [z[k] for k in _NPZ_LABELS if k in z.files and k != yk]
    except DataError:
        raise
    except Exception as exc:  # zip, format and pickle refusals all mean "unreadable"
        raise DataError(f"{where}: cannot read {file} as .npz ({_first_line(exc)})") from None
    x, divisor = _npz_images(x_arr, f"{where} array '{xk}'")
    y = _npz_labels(y_arr, len(x), f"{where} array '{yk}'")
    tops = [int(a.max()) for a in [y, *other_labels] if a.size and np.issubdtype(a.dtype, np.integer)]
    desc = f"{len(x)} samples '{xk}'/'{yk}' from {file}"
    return DataSource(ArrayDataset(x, torch.from_numpy(y), divisor), max(tops) + 1 if tops else None, desc)


# ---------------------------------------------------------------- digits (embedded)

DIGITS_TRAIN = 1437  # first 1437 train, last 360 test: fixed so results stay comparable


@register_dataset("digits")
def digits(*, split: str, **_: Any) -> DataSource:
    """The 1797 UCI ML hand-written digits (8x8, values 0..16, as scikit-learn ships them),
    embedded in the package; tools/make_digits_asset.py regenerates the file."""
    blob = resources.files("flatcheck.data").joinpath("assets/digits.npz").read_bytes()
    with np.load(io.BytesIO(blob), allow_pickle=False) as z:
        x, y = z["x"], z["y"]
    part = slice(0, DIGITS_TRAIN) if split == "train" else slice(DIGITS_TRAIN, None)
    xt = torch.from_numpy(x[part].copy()).unsqueeze(1)
    what = f"first {DIGITS_TRAIN}" if split == "train" else f"last {len(x) - DIGITS_TRAIN}"
    return DataSource(ArrayDataset(xt, torch.from_numpy(y[part].copy()), 16.0), 10,
                      f"digits {split} split: the {what} of the 1797 UCI ML hand-written digits (8x8, embedded)")


# ---------------------------------------------------------------- synthetic

SYNTHETIC_SIZES = {"train": 2048, "test": 512}


class SyntheticDataset(Dataset):
    """Gaussian pixels N(0.5, 0.25^2) clipped to [0, 1], so preprocessing treats them like
    any image; each sample is drawn from its own seed, so nothing is held in memory and
    sample i is the same whatever order it is read in."""

    def __init__(self, n: int, shape: tuple[int, ...], num_classes: int, seed: int, split: str) -> None:
        self.n, self.shape = n, shape
        self._key = [seed % 2**64, 0 if split == "train" else 1]
        self.labels = np.random.default_rng(self._key + [2**32]).integers(0, num_classes, size=n)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        if not 0 <= index < self.n:
            raise IndexError(index)
        z = np.random.default_rng(self._key + [index]).standard_normal(self.shape, dtype=np.float32)
        return torch.from_numpy(np.clip(0.5 + 0.25 * z, 0.0, 1.0)), int(self.labels[index])


@register_dataset("synthetic")
def synthetic(*, split: str, num_classes: int | None, input_size: tuple[int, ...] | None, seed: int,
              **_: Any) -> DataSource:
    shape = tuple(input_size) if input_size is not None else (3, 32, 32)
    k = 10 if num_classes is None else num_classes
    if k < 1 or not shape or any(d < 1 for d in shape):
        raise DataError(f"data 'synthetic' needs num_classes >= 1 and a positive input_size, got {k} and {list(shape)}")
    n = SYNTHETIC_SIZES[split]
    desc = f"synthetic {split} split: {n} Gaussian samples of shape {tuple(shape)}, {k} classes, seed {seed}"
    return DataSource(SyntheticDataset(n, shape, k, seed, split), k, desc)
