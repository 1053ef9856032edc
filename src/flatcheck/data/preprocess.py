"""What the model expects of its input, resolved once from the spec (and timm's config)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Preprocess:
    """Input contract of a model.

    input_size: (C, H, W) for images or (D,) for flat vectors; None = take the data as it is.
    mean/std: per-channel normalisation applied after scaling to [0, 1]; None = none.
    interpolation: used only when an image's H, W differ from input_size.
    """

    input_size: tuple[int, ...] | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    interpolation: str = "bilinear"
    # where mean/std came from, for messages ("spec file X", "flag --mean", the library's defaults)
    normalisation_from: str = field(default="spec", compare=False)
