"""What runs: the models, and for each its tasks at the CPU or the --full (GPU) sizes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

PEERS = ("pyhessian", "curvlinops", "eigenthings")
LANCZOS_ONLY = ("pyhessian", "curvlinops", "eigenthings:lanczos")  # hessian-eigenthings without power iteration
ONE_PCT = 0.01  # relative standard error Hutchinson must reach in the exact-GGN comparison


@dataclass(frozen=True)
class DataCfg:
    """A sample set: `samples` items cut into batches of `batch`, in `dtype`."""

    samples: int
    batch: int
    dtype: str = "float32"

    @property
    def batches(self) -> int:
        return math.ceil(self.samples / self.batch)

    def label(self) -> str:
        n = self.batches
        return f"{n} batch{'es' if n > 1 else ''} of {self.batch}" + ("" if self.dtype == "float32" else f", {self.dtype}")


@dataclass(frozen=True)
class Task:
    kind: str  # trace, eig, slq, hvpgrad, block, ggn
    data: DataCfg
    opts: dict = field(default_factory=dict)
    peers: tuple[str, ...] = PEERS  # peers that run this task (flatcheck always does)

    def title(self) -> str:
        o = self.opts
        head = {
            "trace": lambda: f"Hutchinson trace, {o['probes']} probes",
            "eig": lambda: f"top-{o['k']} eigenvalue{'s' if o['k'] > 1 else ''}, tol {o['tol']:g}",
            "slq": lambda: f"SLQ density, {o['starts']}×{o['steps']} steps",
            "hvpgrad": lambda: f"HVP ÷ gradient (block of {o['block']})",
            "block": lambda: f"{o['block']} probes: one block vs loop",
            "ggn": lambda: f"exact Tr(GGN) vs Hutchinson at {ONE_PCT:.0%} stderr",
        }[self.kind]()
        return f"{head} · {self.data.label()}"


@dataclass(frozen=True)
class ModelCfg:
    key: str
    title: str
    spec: str
    data: str
    checkpoint: str | None
    tasks: tuple[Task, ...]


def plan(models: list[str], full: bool) -> list[ModelCfg]:
    """Default sizes finish in a few minutes on a 2-core CPU; --full sizes are for a GPU."""
    out = []
    for key in models:
        if key == "demo":
            one = DataCfg(1000, 1000)
            # float64 convolutions are slow on the CPU (~0.5 s per HVP at 1000 samples)
            one64 = DataCfg(1000, 1000, "float64") if full else DataCfg(250, 250, "float64")
            eig = dict(tol=1e-6, max_iter=300, power_iter=1000)
            tasks = (
                Task("trace", one, dict(probes=100 if full else 20)),
                # hessian-eigenthings' power iteration needs 100s of HVPs at this tolerance: --full
                Task("eig", one64, dict(k=1, **eig), peers=PEERS if full else LANCZOS_ONLY),
                Task("eig", one64, dict(k=5, **eig), peers=PEERS if full else LANCZOS_ONLY),
                # the CLI's default batching: each step a product over 8 batches (flatcheck keeps
                # their first-order graphs; PyHessian's dataloader mode rebuilds them every step)
                Task("eig", DataCfg(1000, 128), dict(k=1, tol=1e-4, max_iter=100, power_iter=200),
                     peers=PEERS if full else ("pyhessian",)),
                Task("slq", one, dict(steps=80 if full else 15, starts=3 if full else 2)),
                Task("hvpgrad", DataCfg(1000, 125), dict(block=16, compile=True)),
                Task("block", one, dict(block=16)),
                Task("block", DataCfg(1000, 128), dict(block=16)),  # the CLI's default batching
                Task("ggn", one, dict(probes=20)),
            )
            out.append(ModelCfg(key, "demo DigitsCNN (demo/digits_cnn.safetensors, digits)", "demo_digits.yaml",
                                "digits", "demo/digits_cnn.safetensors", tasks))
        elif key == "resnet18":
            # On a 2-core CPU one ResNet-18 HVP at batch 64 takes ~4 s (a gradient ~1.7 s), so the
            # CPU defaults are one batch of 16 and 8 batches of 8; --full has the GPU sizes.
            one = DataCfg(256, 256) if full else DataCfg(16, 16)
            eight = DataCfg(8 * 256, 256) if full else DataCfg(64, 8)
            probes = 100 if full else 10
            tasks = [
                Task("trace", one, dict(probes=probes)),
                # curvlinops and hessian-eigenthings make one forward per product and batch; on the
                # CPU they would take minutes here: --full runs them.
                Task("trace", eight, dict(probes=probes if full else 5), peers=PEERS if full else ("pyhessian",)),
                # torch.compile of a ResNet-18 HVP takes minutes on this CPU: --full compiles it
                Task("hvpgrad", one, dict(block=8 if full else 4, compile=full)),
                Task("hvpgrad", eight, dict(block=8 if full else 4, compile=full)),
                Task("ggn", one, dict(probes=probes)),
            ]
            if full:  # the demo has these on the CPU
                tasks += [Task("eig", one, dict(k=1, tol=1e-3, max_iter=100, power_iter=100)),
                          Task("slq", one, dict(steps=80, starts=3))]
            out.append(ModelCfg(key, "ResNet-18 CIFAR (random weights, synthetic 32×32, 10 classes)",
                                "resnet18_cifar.yaml", "synthetic", None, tuple(tasks)))
        elif key == "vit":
            b = 32 if full else 4
            one = DataCfg(b, b)
            tasks = [Task("trace", one, dict(probes=20 if full else 4)), Task("hvpgrad", one, dict(block=8 if full else 2))]
            if full:
                tasks += [Task("eig", one, dict(k=1, tol=1e-3, max_iter=100, power_iter=100)),
                          Task("slq", one, dict(steps=40, starts=1))]
            out.append(ModelCfg(key, "ViT-S/16 at 224 (timm, random weights, synthetic, 1000 classes)",
                                "vit_small_patch16_224.yaml", "synthetic", None, tuple(tasks)))
        else:
            raise SystemExit(f"--models: unknown model {key!r}; choose from demo, resnet18, vit")
    return out
