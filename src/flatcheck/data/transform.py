"""Turn one raw sample (float in [0, 1], (C,H,W) or (D,)) into what the model expects.

Deliberately strict: a silent crop or reshape would let flatcheck measure the geometry of a
model on inputs it was never trained on, and the numbers would still look plausible. Done
implicitly: resizing, because checkpoints are routinely evaluated at their own resolution on
data stored at another, and the two standard channel conversions when the spec's input_size
asks for them — grey to RGB by replication and RGB to grey by luminance, as torchvision's
Grayscale and PIL's convert("L") make them — which the report names (data.channels).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from flatcheck.data.preprocess import Preprocess
from flatcheck.errors import DataError

INTERPOLATIONS = ("nearest", "nearest-exact", "bilinear", "bicubic", "area")
# antialias only exists for these modes in F.interpolate
_ANTIALIAS_MODES = ("bilinear", "bicubic")


# ITU-R 601-2 luma, the weights of PIL's convert("L") and torchvision's Grayscale
_LUMA = torch.tensor((0.299, 0.587, 0.114))


def channel_conversion(have: int, want: int) -> str | None:
    """How `have`-channel images are made `want`-channel ones, or None when no standard way is."""
    if (have, want) == (1, 3):
        return "grey → RGB (replicated)"
    if (have, want) == (3, 1):
        return "RGB → grey (luminance 0.299 R + 0.587 G + 0.114 B)"
    return None


def image_resize(have: Tensor, size: tuple[int, ...] | None, mode: str) -> str | None:
    """How apply_preprocess resizes the image `have` (C,H,W) to `size`, for the report
    ("32×32 → 224×224, bilinear"), or None when it keeps its height and width."""
    if size is None or len(size) != 3 or have.dim() != 3 or tuple(have.shape[1:]) == tuple(size[1:]):
        return None
    return f"{have.shape[1]}×{have.shape[2]} → {size[1]}×{size[2]}, {mode}"


def _shape(t: Tensor | tuple[int, ...]) -> str:
    dims = tuple(t.shape) if isinstance(t, Tensor) else tuple(t)
    return "(" + ",".join(str(d) for d in dims) + ")"


def _spec(size: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in size) + "]"


def sample_dtype(x: Tensor) -> torch.dtype:
    """The dtype samples held as `x` are read and prepared in: float64 kept, so that a float64 run
    measures the stored values (SampleSet rounds them in a float32 run); anything else float32.
    Integer pixels are thus divided in float32, as torchvision's to_tensor does: the values
    models are trained on, and the ones flatcheck.measure gives the same pixels."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def apply_preprocess(x: Tensor, pre: Preprocess, *, source: str) -> Tensor:
    """Resize/flatten/normalise one sample to `pre`; DataError (one line) when it cannot fit.

    Normalisation is applied whenever mean/std are set, also with input_size None: a spec
    that names mean/std but no size still means the model was trained on normalised data.
    It happens before flattening so that a per-channel mean works for a flat (MLP) target.
    """
    x = x.to(sample_dtype(x))
    size = tuple(pre.input_size) if pre.input_size is not None else None
    if size is not None and len(size) == 3:
        x = _fit_image(x, size, pre.interpolation, source)
    elif size is not None and len(size) != 1:
        raise DataError(f"data '{source}': spec input_size {_spec(size)} must be [C,H,W] or [D]")
    x = _normalise(x, pre, source)
    if size is not None and len(size) == 1:
        if x.numel() != size[0]:
            raise DataError(
                f"data '{source}' gives samples of shape {_shape(x)} = {x.numel()} values; "
                f"spec input_size is {_spec(size)}"
            )
        x = x.reshape(-1)
    return x.contiguous()


def _fit_image(x: Tensor, size: tuple[int, ...], mode: str, source: str) -> Tensor:
    c, h, w = size
    if x.dim() != 3:
        # a lone --input-size S means 3,S,S (an RGB image), so a flat size has to be given as a list
        flat = (f"; flat samples need input_size [{x.numel()}] (--set 'input_size=[{x.numel()}]'; a lone "
                "--input-size S means 3,S,S)" if x.dim() == 1 else "")
        raise DataError(
            f"data '{source}' gives samples of shape {_shape(x)}; spec input_size {_spec(size)} needs (C,H,W) images"
            + flat
        )
    if x.shape[0] != c:
        if channel_conversion(x.shape[0], c) is None:
            raise DataError(
                f"data '{source}' gives {x.shape[0]}-channel images {_shape(x)}; "
                f"spec input_size {_spec(size)} needs {c} channels (flatcheck converts only grey ↔ RGB)"
            )
        x = x.expand(3, -1, -1) if c == 3 else torch.tensordot(_LUMA.to(x.dtype), x, dims=1).unsqueeze(0)
    if tuple(x.shape[1:]) == (h, w):
        return x
    if mode not in INTERPOLATIONS:
        raise DataError(
            f"data '{source}': interpolation '{mode}' is not supported; expected one of {', '.join(INTERPOLATIONS)}"
        )
    shrinking = h < x.shape[1] or w < x.shape[2]
    kwargs: dict = {}
    if mode in _ANTIALIAS_MODES:
        # without antialiasing, downscaling aliases high frequencies into the image,
        # which PIL-based training pipelines never showed the model
        kwargs = {"align_corners": False, "antialias": shrinking}
    return F.interpolate(x.unsqueeze(0), size=(h, w), mode=mode, **kwargs).squeeze(0)


def elementwise(pre: Preprocess, sample_shape: tuple[int, ...]) -> bool:
    """Whether apply_preprocess on samples of this shape is elementwise: no resize, no channel
    conversion, at most a flattening to the spec's one-dimensional input size."""
    size = tuple(pre.input_size) if pre.input_size is not None else None
    return size is None or (size == sample_shape if len(size) == 3
                            else len(size) == 1 and math.prod(sample_shape) == size[0])


def apply_preprocess_batch(x: Tensor, pre: Preprocess, *, source: str) -> Tensor | None:
    """apply_preprocess on every sample of the batch `x` (B, ...) of same-shaped samples at once,
    where it is elementwise (no resize, no channel conversion): the values it gives each sample,
    bit for bit (the same IEEE operations on the same elements), stacked. None where it is not
    elementwise: the caller prepares the samples one by one."""
    if not elementwise(pre, tuple(x.shape[1:])):
        return None
    x = _normalise(x.to(sample_dtype(x)), pre, source, batched=True)
    if pre.input_size is not None and len(pre.input_size) == 1:
        x = x.reshape(x.shape[0], -1)
    return x.contiguous()


def _normalise(x: Tensor, pre: Preprocess, source: str, batched: bool = False) -> Tensor:
    """(x − mean) / std per channel; `batched`: x is a batch of samples, each checked as one."""
    if pre.mean is None and pre.std is None:
        return x
    one = x[0] if batched else x  # what the checks read: a sample's shape
    mean = torch.tensor(pre.mean if pre.mean is not None else (0.0,), dtype=x.dtype)
    std = torch.tensor(pre.std if pre.std is not None else (1.0,), dtype=x.dtype)
    if (std == 0).any():
        raise DataError(f"data '{source}': spec std {list(pre.std or ())} contains 0")
    for name, v in (("mean", mean), ("std", std)):
        if v.numel() == 1:
            continue
        if one.dim() == 3 and v.numel() == one.shape[0]:
            continue
        if one.dim() == 1 and v.numel() == one.shape[0]:
            continue
        raise DataError(
            f"data '{source}' gives samples of shape {_shape(one)}; {name} has {v.numel()} values "
            f"(from {pre.normalisation_from}), expected 1 or one per channel"
        )
    if one.dim() == 3:
        mean, std = mean.view(-1, 1, 1), std.view(-1, 1, 1)
    return (x - mean) / std
