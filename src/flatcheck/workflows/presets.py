"""Named scan protocols: a paper's measurement as probes, options and sample count, and the
figure `flatcheck report --preset` draws from its records.

mls-vs-sharpness (Chen et al. 2023 §4.3, App. F, Fig. 4): elementwise adaptive sharpness with
a sigmoid on the logits and the MSE loss (Andriushchenko et al. 2023's average-case definition,
δ ~ N(0, ρ² diag|w|²)), and normalized MLS of the sigmoid output, (1/N) Σ ‖x_n‖·‖J_n‖₂ with J_n = ∂σ(f(x_n))/∂x_n;
Fig. 4 plots the second
against the first on log axes, one colour per model family. The paper's text gives neither ρ
nor the number of noise draws or samples; the preset keeps flatcheck's ρ = 5e-4 and takes its
headline from whichever route resolves the value (adaptive_sharpness: details.route). Each
model is fed its own preprocessing (timm's pretrained config: input size, mean, std), which a
timm entry resolves per model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError


@dataclass(frozen=True)
class ScanPreset:
    name: str
    cite: str
    probes: str
    options: tuple[str, ...]  # -o PROBE.KEY=VALUE, before the user's own (which win)
    samples: int  # a default as flatcheck's own is: a smaller split is measured whole (commands.scan)
    figure: dict[str, object] = field(default_factory=dict)  # report: x, y, logx, logy


PRESETS = {
    "mls-vs-sharpness": ScanPreset(
        name="mls-vs-sharpness",
        cite="Chen et al. 2023, App. F and Fig. 4",
        probes="adaptive-sharpness,mls",
        # Fig. 4 plots normalized MLS: the per-layer NMLS would be nearly all of the cost
        options=("adaptive-sharpness.loss=sigmoid_mse", "mls.output=sigmoid", "mls.nmls=false"),
        samples=1000,
        figure={"x": "adaptive-sharpness", "y": "mls.normalized_mls", "logx": True, "logy": True,
                "xlabel": "elementwise adaptive sharpness S_ρ (sigmoid + MSE)",
                "ylabel": "normalized MLS of σ(f)  (1/N) Σ ‖x_n‖·‖J_n‖₂",
                "title": "Chen et al. 2023, Fig. 4: normalized MLS vs adaptive sharpness",
                # what the labels name: records measured otherwise are not this figure's points
                "requires": {"adaptive-sharpness.details.loss": "sigmoid_mse", "mls.details.output": "sigmoid"}},
    ),
}


def preset(name: str, flag: str = "--preset") -> ScanPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"{flag} {name!r}: no such preset; known: {', '.join(PRESETS)}") from None
