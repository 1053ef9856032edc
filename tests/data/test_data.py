"""Data sources, the registry and preprocessing.

Every on-disk source is exercised on tiny files written here in the real on-disk format
of its torchvision counterpart, since no data set can be downloaded in tests.
"""

from __future__ import annotations

import pickle
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flatcheck.data import Preprocess, apply_preprocess, create_dataset, list_datasets, registry
from flatcheck.data.registry import DataSource, MissingSplitError, register_dataset
from flatcheck.errors import DataError, InputError

ALL = ["cifar10", "cifar100", "digits", "fashion-mnist", "imagefolder", "mnist", "npz", "svhn", "synthetic"]


@pytest.fixture(autouse=True)
def _no_env_root(monkeypatch):
    monkeypatch.delenv("FLATCHECK_DATA_ROOT", raising=False)


def to_uint8(x: torch.Tensor) -> np.ndarray:
    return (x * 255).round().to(torch.uint8).numpy()


# ------------------------------------------------------------------ registry


def test_list_datasets_has_all_builtins():
    assert list_datasets() == ALL


def test_list_datasets_pattern():
    assert list_datasets("*mnist") == ["fashion-mnist", "mnist"]
    assert list_datasets("CIFAR*") == ["cifar10", "cifar100"]
    assert list_datasets("nothing*") == []


def test_unknown_name_lists_available():
    with pytest.raises(DataError) as e:
        create_dataset("imagenet")
    msg = str(e.value)
    assert "'imagenet'" in msg and "\n" not in msg
    for name in ("cifar10", "digits", "synthetic", "npz:PATH", "imagefolder:PATH"):
        assert name in msg
    assert e.value.exit_code == 2


def test_bare_path_gets_a_hint(tmp_path):
    with pytest.raises(DataError, match="npz:"):
        create_dataset(str(tmp_path / "x.npz"))


def test_name_spelling_is_forgiving():
    assert registry.parse_uri("Fashion_MNIST") == ("fashion-mnist", None)
    assert registry.parse_uri("npz:/a:b.npz") == ("npz", "/a:b.npz")


def test_path_required_and_refused():
    with pytest.raises(DataError, match="npz:PATH"):
        create_dataset("npz")
    with pytest.raises(DataError, match="takes no path"):
        create_dataset("digits:/tmp/x")


def test_bad_split():
    with pytest.raises(DataError, match="split 'val'.*train, test"):
        create_dataset("digits", split="val")


def test_register_custom_source():
    seen = {}

    @register_dataset("unit-test-ramp")
    def ramp(*, root, split, path, num_classes, input_size, seed):
        seen.update(root=root, split=split, seed=seed, input_size=input_size)
        xs = torch.linspace(0, 1, 12).reshape(3, 4)
        return DataSource([(x, i % 2) for i, x in enumerate(xs)], 2, "a ramp")

    try:
        ds = create_dataset("unit-test-ramp", root="/r", split="test", seed=7, preprocess=Preprocess((4,)))
        assert seen == {"root": Path("/r"), "split": "test", "seed": 7, "input_size": (4,)}
        assert len(ds) == 3 and ds.sample_shape == (4,) and ds.num_classes == 2
        assert ds[1][1] == 1 and ds[2][0].dtype == torch.float32
        assert "unit-test-ramp" in list_datasets("unit-*")
    finally:
        registry._REGISTRY.pop("unit-test-ramp")


def test_more_classes_than_model_outputs(tmp_path):
    f = tmp_path / "d.npz"
    np.savez(f, x=np.zeros((4, 5), np.float32), y=np.array([0, 1, 2, 5]))
    assert create_dataset(f"npz:{f}", num_classes=6).num_classes == 6
    with pytest.raises(DataError, match="6 classes but the model has 3 outputs"):
        create_dataset(f"npz:{f}", num_classes=3)


# ------------------------------------------------------------------ digits


def _asset():
    from importlib import resources

    with resources.files("flatcheck.data").joinpath("assets/digits.npz").open("rb") as fh:
        z = np.load(fh)
        return z["x"], z["y"]


def test_digits_asset_contents():
    x, y = _asset()
    assert x.shape == (1797, 8, 8) and x.dtype == np.uint8 and y.dtype == np.int64
    # pins the file to scikit-learn's digits.csv.gz: totals, first label, class counts
    assert int(x.astype(np.int64).sum()) == 561718 and x.max() == 16
    assert y[0] == 0 and y[:10].tolist() == list(range(10))
    assert np.bincount(y).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


def test_digits_splits():
    x, y = _asset()
    train, test = create_dataset("digits"), create_dataset("digits", split="test")
    assert (len(train), len(test)) == (1437, 360)
    assert train.sample_shape == (1, 8, 8) and train.num_classes == 10
    assert train.name == "digits" and train.split == "train" and "1437" in train.description
    xs = torch.stack([train[i][0] for i in range(len(train))])
    assert xs.dtype == torch.float32 and 0 <= xs.min() and xs.max() <= 1
    assert torch.equal(xs * 16, torch.from_numpy(x[:1437]).float().unsqueeze(1))
    labels = [train[i][1] for i in range(len(train))] + [test[i][1] for i in range(len(test))]
    assert labels == y.tolist() and set(labels) == set(range(10))
    assert sum(np.bincount(labels)) == 1797
    assert train[0][1] == y[0] and test[0][1] == y[1437]
    assert torch.equal(test[0][0] * 16, torch.from_numpy(x[1437]).float().unsqueeze(0))


# ------------------------------------------------------------------ CIFAR


def _py2_pickle(data: np.ndarray, labels: list[int], label_key: str) -> bytes:
    """A dict pickled the way Python 2 / numpy 1.x wrote the official CIFAR files:
    str (SHORT_BINSTRING) keys, numpy.core.multiarray._reconstruct, raw bytes as a str."""

    def s(b: bytes) -> bytes:
        return (b"U" + bytes([len(b)]) + b) if len(b) < 256 else (b"T" + struct.pack("<I", len(b)) + b)

    def i(v: int) -> bytes:
        return b"K" + bytes([v]) if 0 <= v < 256 else b"J" + struct.pack("<i", v)

    dtype = (b"cnumpy\ndtype\n" + s(b"u1") + i(0) + i(1) + b"\x87R"
             + b"(" + i(3) + s(b"|") + b"NNN" + i(-1) + i(-1) + i(0) + b"tb")
    shape = b"".join(i(d) for d in data.shape) + b"\x86"
    array = (b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + i(0) + b"\x85" + s(b"b") + b"\x87R"
             + b"(" + i(1) + shape + dtype + b"\x89" + s(data.tobytes()) + b"tb")
    labs = b"](" + b"".join(i(v) for v in labels) + b"e"
    return b"\x80\x02}(" + s(b"data") + array + s(label_key.encode()) + labs + b"u."


def _write_cifar(root: Path, folder: str, files: dict[str, int], label_key: str, fmt: str = "py2", seed=0):
    """torchvision's layout. fmt: py2 = as the official files; py3-str / py3-bytes = pickled from
    Python 3 with str or bytes keys (the latter is what the CIFAR page's unpickle() shows)."""
    rng = np.random.default_rng(seed)
    base = root / folder
    base.mkdir(parents=True)
    written = {}
    for name, n in files.items():
        entry = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), label_key: rng.integers(0, 10, n).tolist()}
        if fmt == "py2":
            blob = _py2_pickle(entry["data"], entry[label_key], label_key)
        else:
            keyed = {(k.encode() if fmt == "py3-bytes" else k): v for k, v in entry.items()}
            blob = pickle.dumps(keyed | {"batch_label": name}, protocol=2)
        (base / name).write_bytes(blob)
        written[name] = entry
    return written


def _cifar10(root, fmt="py2"):
    files = {f"data_batch_{i}": 2 for i in range(1, 6)} | {"test_batch": 3}
    written = _write_cifar(root, "cifar-10-batches-py", files, "labels", fmt)
    (root / "cifar-10-batches-py" / "batches.meta").write_bytes(
        pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}, protocol=2))
    return written


@pytest.mark.parametrize("fmt", ["py2", "py3-str", "py3-bytes"])
def test_cifar10_round_trip(tmp_path, fmt):
    written = _cifar10(tmp_path, fmt)
    train = create_dataset("cifar10", root=tmp_path)
    test = create_dataset("cifar10", root=str(tmp_path), split="test")
    assert (len(train), len(test)) == (10, 3) and train.sample_shape == (3, 32, 32) and train.num_classes == 10
    data = np.concatenate([written[f"data_batch_{i}"]["data"] for i in range(1, 6)])
    labels = sum((written[f"data_batch_{i}"]["labels"] for i in range(1, 6)), [])
    for i in range(10):
        x, y = train[i]
        assert x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1
        assert np.array_equal(to_uint8(x), data[i].reshape(3, 32, 32)) and y == labels[i]
    x, y = test[2]
    assert np.array_equal(to_uint8(x), written["test_batch"]["data"][2].reshape(3, 32, 32))
    assert y == written["test_batch"]["labels"][2]
    assert "CIFAR-10 test split from" in test.description and "cifar-10-batches-py" in test.description


def test_cifar10_pixel_order_matches_torchvision_layout(tmp_path):
    # one image whose rows are R=1.., G, B planes: channel c must be plane c
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    row = np.concatenate([np.full(1024, v, np.uint8) for v in (10, 20, 30)])
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (base / name).write_bytes(pickle.dumps({"data": row[None], "labels": [4]}, protocol=2))
    x, y = create_dataset("cifar10", root=tmp_path, split="test")[0]
    assert to_uint8(x)[:, 0, 0].tolist() == [10, 20, 30] and y == 4


def test_cifar100_round_trip(tmp_path):
    written = _write_cifar(tmp_path, "cifar-100-python", {"train": 4, "test": 2}, "fine_labels")
    for split, name in (("train", "train"), ("test", "test")):
        ds = create_dataset("cifar100", root=tmp_path, split=split)
        assert ds.num_classes == 100 and len(ds) == written[name]["data"].shape[0]
        for i in range(len(ds)):
            x, y = ds[i]
            assert np.array_equal(to_uint8(x), written[name]["data"][i].reshape(3, 32, 32))
            assert y == written[name]["fine_labels"][i]


def test_cifar_missing_root_names_expected_path(tmp_path):
    with pytest.raises(DataError) as e:
        create_dataset("cifar10")
    assert "cifar-10-batches-py" in str(e.value) and "FLATCHECK_DATA_ROOT" in str(e.value)
    with pytest.raises(DataError) as e:
        create_dataset("cifar10", root=tmp_path)
    msg = str(e.value)
    assert str(tmp_path / "cifar-10-batches-py" / "data_batch_1") in msg
    assert "torchvision.datasets.CIFAR10(root, download=True)" in msg and "\n" not in msg


def test_data_root_env_is_honoured(tmp_path, monkeypatch):
    _cifar10(tmp_path)
    monkeypatch.setenv("FLATCHECK_DATA_ROOT", str(tmp_path))
    assert len(create_dataset("cifar10", split="test")) == 3
    # an explicit root wins over the environment
    with pytest.raises(DataError, match=str(tmp_path / "elsewhere")):
        create_dataset("cifar10", root=tmp_path / "elsewhere")


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_cifar_refuses_pickled_code(tmp_path, capsys):
    _cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(pickle.dumps({"data": _Evil()}, protocol=2))
    with pytest.raises(DataError, match=r"refusing to load global \S*print"):
        create_dataset("cifar10", root=tmp_path, split="test")
    assert "must never run" not in capsys.readouterr().out


def test_cifar_malformed_file(tmp_path):
    _cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"\x80\x02truncated")
    with pytest.raises(DataError, match="test_batch: not a CIFAR python batch file"):
        create_dataset("cifar10", root=tmp_path, split="test")
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(
        pickle.dumps({"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]}, protocol=2))
    with pytest.raises(DataError, match=r"shape \(n, 3072\)"):
        create_dataset("cifar10", root=tmp_path, split="test")


# ------------------------------------------------------------------ MNIST / SVHN


def _idx(path: Path, arr: np.ndarray) -> None:
    # SN3 / idx: 0x00 0x00 <type 0x08 = uint8> <ndim>, big-endian dims, then the bytes
    header = bytes([0, 0, 8, arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape)
    path.write_bytes(header + arr.astype(np.uint8).tobytes())


def _write_mnist(root: Path, cls: str, n_train=5, n_test=3) -> dict:
    rng = np.random.default_rng(1)
    raw = root / cls / "raw"
    raw.mkdir(parents=True)
    out = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        x, y = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n, dtype=np.uint8)
        _idx(raw / f"{prefix}-images-idx3-ubyte", x)
        _idx(raw / f"{prefix}-labels-idx1-ubyte", y)
        out[prefix] = (x, y)
    return out


@pytest.mark.parametrize("name,cls", [("mnist", "MNIST"), ("fashion-mnist", "FashionMNIST")])
def test_mnist_round_trip(tmp_path, name, cls):
    written = _write_mnist(tmp_path, cls)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        ds = create_dataset(name, root=tmp_path, split=split)
        x, y = written[prefix]
        assert len(ds) == len(x) and ds.sample_shape == (1, 28, 28) and ds.num_classes == 10
        for i in range(len(ds)):
            xi, yi = ds[i]
            assert np.array_equal(to_uint8(xi)[0], x[i]) and yi == y[i]


def test_mnist_missing_file_is_named(tmp_path):
    _write_mnist(tmp_path, "MNIST")
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError) as e:
        create_dataset("mnist", root=tmp_path)
    assert str(tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte") in str(e.value)
    assert "torchvision.datasets.MNIST(root, download=True)" in str(e.value)


def test_svhn_round_trip(tmp_path):
    from scipy.io import savemat

    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (32, 32, 3, 4), dtype=np.uint8)  # SVHN's H, W, C, N layout
    y = np.array([[10], [1], [2], [10]], dtype=np.uint8)  # 10 stands for the digit 0
    savemat(tmp_path / "test_32x32.mat", {"X": x, "y": y})
    ds = create_dataset("svhn", root=tmp_path, split="test")
    assert len(ds) == 4 and ds.sample_shape == (3, 32, 32)
    assert [ds[i][1] for i in range(4)] == [0, 1, 2, 0]
    assert np.array_equal(to_uint8(ds[3][0]), x[..., 3].transpose(2, 0, 1))
    with pytest.raises(DataError, match="train_32x32.mat"):
        create_dataset("svhn", root=tmp_path, split="train")


# ------------------------------------------------------------------ npz / imagefolder


def test_npz_layouts_round_trip(tmp_path):
    rng = np.random.default_rng(3)
    nchw = rng.integers(0, 256, (4, 3, 5, 6), dtype=np.uint8)
    y = np.array([0, 1, 2, 1])
    for name, x in {"nchw": nchw, "nhwc": nchw.transpose(0, 2, 3, 1)}.items():
        np.savez(tmp_path / f"{name}.npz", x=x, y=y)
        ds = create_dataset(f"npz:{tmp_path / name}.npz")
        assert ds.sample_shape == (3, 5, 6) and ds.num_classes == 3
        assert all(np.array_equal(to_uint8(ds[i][0]), nchw[i]) and ds[i][1] == y[i] for i in range(4))
    grey = rng.integers(0, 256, (4, 7, 7), dtype=np.uint8)
    np.savez(tmp_path / "grey.npz", x=grey, y=y)
    assert create_dataset(f"npz:{tmp_path}/grey.npz").sample_shape == (1, 7, 7)


def test_npz_float_vectors_and_test_split(tmp_path):
    x = np.linspace(0, 1, 12, dtype=np.float64).reshape(4, 3)  # [0, 1] floats are kept as they are
    xt = np.ones((2, 3), np.float32)
    f = tmp_path / "v.npz"
    np.savez(f, x=x, y=np.arange(4), x_test=xt, y_test=np.array([7, 0]))
    train, test = create_dataset(f"npz:{f}"), create_dataset(f"npz:{f}", split="test")
    assert train.sample_shape == (3,) and torch.equal(train[3][0], torch.tensor(x[3]))  # float64 too
    assert len(test) == 2 and test[0][1] == 7
    assert train.num_classes == test.num_classes == 8


def test_npz_keras_layout(tmp_path):
    f = tmp_path / "k.npz"
    np.savez(f, x_train=np.zeros((3, 2), np.uint8), y_train=np.array([0, 1, 4]),
             x_test=np.full((2, 2), 255, np.uint8), y_test=np.array([2, 2]))
    train, test = create_dataset(f"npz:{f}"), create_dataset(f"npz:{f}", split="test")
    assert [train[i][1] for i in range(3)] == [0, 1, 4] and len(test) == 2
    assert torch.equal(test[1][0], torch.ones(2)) and train.num_classes == 5
    np.savez(f, x=np.zeros((3, 2), np.uint8), y=np.zeros(3, np.int64),
             x_train=np.zeros((3, 2), np.uint8), y_train=np.zeros(3, np.int64))
    with pytest.raises(DataError, match=r"\('x', 'y'\) and \('x_train', 'y_train'\) both"):
        create_dataset(f"npz:{f}")


def test_npz_without_test_arrays_has_no_test_split(tmp_path):
    f = tmp_path / "v.npz"
    np.savez(f, x=np.zeros((3, 2), np.float32), y=np.zeros(3, np.int64))
    assert len(create_dataset(f"npz:{f}")) == 3
    with pytest.raises(MissingSplitError, match=r"v\.npz: no test split: expected arrays 'x_test' and 'y_test' "
                                                r"\(found x, y\)"):
        create_dataset(f"npz:{f}", split="test")


@pytest.mark.parametrize(
    "values, found",
    [([0.0, 255.0], "0..255"), ([-0.5, 0.5], "-0.5..0.5"), ([np.nan, 0.0, 1.0001], "0..1"),
     ([-np.inf, 0.0, 0.5], None), ([np.nan, 0.0, 1.0], None), ([0.0, 1.0], None)],
)
def test_npz_float_range(tmp_path, values, found):
    # non-finite values are not a range question: the SampleSet names the sample that holds one
    f = tmp_path / "r.npz"
    np.savez(f, x=np.array(values, np.float32).reshape(-1, 1), y=np.zeros(len(values), np.int64))
    if found is None:
        assert len(registry._REGISTRY["npz"].factory(path=str(f), split="train").dataset) == len(values)
        return
    with pytest.raises(DataError, match=rf"array 'x': float values must lie in \[0, 1\], found {found};"):
        create_dataset(f"npz:{f}")


def test_npz_errors(tmp_path):
    f = tmp_path / "v.npz"
    np.savez(f, x=np.zeros((3, 2), np.float32))
    with pytest.raises(DataError, match=r"npz:.*v\.npz: array 'y' missing \(found x\)"):
        create_dataset(f"npz:{f}")
    np.savez(f, x=np.zeros((3, 2), np.float32), y=np.zeros(3, np.int64), y_test=np.zeros(1, np.int64))
    with pytest.raises(DataError, match="array 'x_test' missing"):
        create_dataset(f"npz:{f}", split="test")
    np.savez(f, x=np.zeros((3, 2), np.int32), y=np.zeros(3, np.int64))
    with pytest.raises(DataError, match="uint8 .* or float"):
        create_dataset(f"npz:{f}")
    np.savez(f, x=np.zeros((3, 2), np.float32), y=np.zeros(4, np.int64))
    with pytest.raises(DataError, match="4 labels for 3 samples"):
        create_dataset(f"npz:{f}")
    np.savez(f, x=np.array([{"a": 1}] * 3, dtype=object), y=np.zeros(3, np.int64))
    with pytest.raises(DataError, match="cannot read"):
        create_dataset(f"npz:{f}")
    with pytest.raises(DataError, match="not found"):
        create_dataset(f"npz:{tmp_path}/absent.npz")
    # text, or a single .npy: not numpy's advice to load a pickle unsafely
    for name, write in (("notes.npz", lambda p: p.write_text("x,y\n1,2\n")),
                        ("one.npy", lambda p: np.save(p, np.zeros(3)))):
        write(tmp_path / name)
        with pytest.raises(DataError, match=f"{name} is not an .npz archive") as info:
            create_dataset(f"npz:{tmp_path / name}")
        assert "pickle" not in str(info.value)


def _png(path: Path, arr: np.ndarray) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)


def test_imagefolder_splits_and_round_trip(tmp_path):
    rng = np.random.default_rng(4)
    imgs = {p: rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
            for p in ("train/cat/a.png", "train/dog/b.png", "train/dog/c.png", "val/dog/d.png")}
    for p, a in imgs.items():
        _png(tmp_path / p, a)
    train = create_dataset(f"imagefolder:{tmp_path}")
    test = create_dataset(f"imagefolder:{tmp_path}", split="test")  # falls back to val/
    assert train.num_classes == test.num_classes == 2 and train.sample_shape == (3, 6, 5)
    assert [train[i][1] for i in range(3)] == [0, 1, 1]
    assert np.array_equal(to_uint8(train[2][0]), imgs["train/dog/c.png"].transpose(2, 0, 1))
    assert len(test) == 1 and test[0][1] == 1  # 'dog' keeps train's index without a 'cat' folder
    assert np.array_equal(to_uint8(test[0][0]), imgs["val/dog/d.png"].transpose(2, 0, 1))


def test_imagefolder_flat_layout_and_errors(tmp_path):
    grey = np.full((4, 4), 200, np.uint8)
    _png(tmp_path / "flat" / "only" / "g.png", grey)
    ds = create_dataset(f"imagefolder:{tmp_path / 'flat'}")
    assert "train split only" in ds.description
    assert ds.sample_shape == (3, 4, 4) and (to_uint8(ds[0][0]) == 200).all()  # grey read as RGB
    with pytest.raises(MissingSplitError, match=r"flat: no test split: .* no test/ or val/ subfolder"):
        create_dataset(f"imagefolder:{tmp_path / 'flat'}", split="test")
    with pytest.raises(DataError, match="not found"):
        create_dataset(f"imagefolder:{tmp_path / 'nope'}")
    _png(tmp_path / "s" / "train" / "a" / "x.png", grey)
    with pytest.raises(MissingSplitError, match=r"no test split: expected .*test or .*val"):
        create_dataset(f"imagefolder:{tmp_path / 's'}", split="test")
    _png(tmp_path / "s" / "test" / "b" / "y.png", grey)
    with pytest.raises(DataError, match=r"classes \['b'\]"):
        create_dataset(f"imagefolder:{tmp_path / 's'}", split="test")
    (tmp_path / "s" / "train" / "c").mkdir()
    with pytest.raises(DataError, match=r"class folders \['c'\] in .* hold no image files"):
        create_dataset(f"imagefolder:{tmp_path / 's'}")


def test_imagefolder_with_only_val(tmp_path):
    _png(tmp_path / "val" / "a" / "x.png", np.zeros((4, 4), np.uint8))
    _png(tmp_path / "val" / "b" / "y.png", np.zeros((4, 4), np.uint8))
    test = create_dataset(f"imagefolder:{tmp_path}", split="test")
    assert [test[i][1] for i in range(2)] == [0, 1]  # not one class named 'val'
    with pytest.raises(MissingSplitError, match=r"no train split: expected .*train \(found val/\)"):
        create_dataset(f"imagefolder:{tmp_path}")


def test_imagefolder_ignores_hidden_files_and_folders(tmp_path):
    rng = np.random.default_rng(5)
    visible = ["cat/a.png", "cat/deep/b.png", "dog/c.png"]
    hidden = [".hidden/h.png", "cat/._a.png", "cat/.cache/d.png", "dog/.e.png"]
    for p in visible + hidden:
        _png(tmp_path / p, rng.integers(0, 256, (3, 3), dtype=np.uint8))
    (tmp_path / ".DS_Store").write_bytes(b"\0Bud1")
    (tmp_path / "dog" / ".DS_Store").write_bytes(b"\0Bud1")
    ds = create_dataset(f"imagefolder:{tmp_path}")
    assert ds.num_classes == 2 and [Path(p).name for p, _ in ds.source.dataset.samples] == ["a.png", "b.png", "c.png"]
    assert [ds[i][1] for i in range(3)] == [0, 0, 1]


def test_imagefolder_reads_grey_for_a_one_channel_model(tmp_path):
    rgb = np.random.default_rng(6).integers(0, 256, (5, 4, 3), dtype=np.uint8)
    _png(tmp_path / "k" / "rgb.png", rgb)
    grey = create_dataset(f"imagefolder:{tmp_path}", preprocess=Preprocess(input_size=(1, 5, 4)))
    # PIL's "L": ITU-R 601-2 luma, L = R*299/1000 + G*587/1000 + B*114/1000, rounded
    luma = (rgb.astype(np.int64) @ np.array([299, 587, 114]) + 500) // 1000
    assert grey.sample_shape == (1, 5, 4)
    assert np.abs(to_uint8(grey[0][0])[0].astype(np.int64) - luma).max() <= 1


def test_imagefolder_corrupt_file_is_named(tmp_path):
    _png(tmp_path / "k" / "good.png", np.zeros((4, 4), np.uint8))
    (tmp_path / "k" / "zbad.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(40))
    ds = create_dataset(f"imagefolder:{tmp_path}")  # item 0 is fine: the bad one is found when read
    with pytest.raises(DataError, match=r"cannot read image .*k/zbad\.png"):
        ds[1]


# ------------------------------------------------------------------ synthetic


def test_synthetic_is_seeded():
    pre = Preprocess(input_size=(3, 6, 6))
    a, b = create_dataset("synthetic", preprocess=pre, seed=1), create_dataset("synthetic", preprocess=pre, seed=1)
    c = create_dataset("synthetic", preprocess=pre, seed=2)
    assert len(a) == 2048 and len(create_dataset("synthetic", split="test")) == 512
    assert a.sample_shape == (3, 6, 6) and a.num_classes == 10
    assert torch.equal(a[5][0], b[5][0]) and a[5][1] == b[5][1]
    assert not torch.equal(a[5][0], c[5][0])
    flat = create_dataset("synthetic", preprocess=Preprocess(input_size=(20,)), num_classes=3)
    labels = {flat[i][1] for i in range(200)}
    assert flat.sample_shape == (20,) and labels == {0, 1, 2}
    assert create_dataset("synthetic").sample_shape == (3, 32, 32)


# ------------------------------------------------------------------ preprocessing


def test_preprocess_none_is_identity():
    x = torch.rand(3, 4, 4)
    assert torch.equal(apply_preprocess(x, Preprocess(), source="t"), x)


def test_preprocess_resize_up_matches_interpolate():
    ds = create_dataset("digits", preprocess=Preprocess(input_size=(1, 16, 16)))
    assert ds.sample_shape == (1, 16, 16)
    raw = create_dataset("digits")[3][0]
    want = F.interpolate(raw[None], size=(16, 16), mode="bilinear", align_corners=False)[0]
    assert torch.allclose(ds[3][0], want)
    const = torch.full((3, 5, 5), 0.25)
    up = apply_preprocess(const, Preprocess(input_size=(3, 9, 7), interpolation="bicubic"), source="t")
    assert up.shape == (3, 9, 7) and torch.allclose(up, torch.full_like(up, 0.25))


def test_preprocess_downscale_is_antialiased():
    x = torch.rand(3, 32, 32)
    got = apply_preprocess(x, Preprocess(input_size=(3, 8, 8)), source="t")
    want = F.interpolate(x[None], size=(8, 8), mode="bilinear", antialias=True, align_corners=False)[0]
    assert torch.allclose(got, want)


def test_preprocess_normalisation_numbers():
    x = torch.stack([torch.full((2, 2), v) for v in (0.0, 0.5, 1.0)])
    pre = Preprocess(input_size=(3, 2, 2), mean=(0.5, 0.5, 0.25), std=(0.5, 0.25, 0.5))
    y = apply_preprocess(x, pre, source="t")
    assert y[:, 0, 0].tolist() == [-1.0, 0.0, 1.5]
    scalar = apply_preprocess(x, Preprocess(mean=(0.5,), std=(0.5,)), source="t")
    assert scalar[:, 1, 1].tolist() == [-1.0, 0.0, 1.0]


def test_preprocess_flatten_with_channel_mean():
    x = torch.stack([torch.zeros(2, 2), torch.ones(2, 2)])
    y = apply_preprocess(x, Preprocess(input_size=(8,), mean=(0.0, 1.0), std=(1.0, 2.0)), source="t")
    assert y.shape == (8,) and y.tolist() == [0.0] * 8
    ds = create_dataset("digits", preprocess=Preprocess(input_size=(64,)))
    assert ds.sample_shape == (64,) and torch.equal(ds[0][0], create_dataset("digits")[0][0].reshape(-1))


def test_preprocess_wrong_sizes():
    with pytest.raises(DataError) as e:
        create_dataset("digits", preprocess=Preprocess(input_size=(100,)))
    assert str(e.value) == "data 'digits' gives samples of shape (1,8,8) = 64 values; spec input_size is [100]"
    with pytest.raises(DataError, match="1-channel images .* needs 2 channels"):  # 1 → 3 is converted
        create_dataset("digits", preprocess=Preprocess(input_size=(2, 8, 8)))
    with pytest.raises(DataError, match=r"shape \(10\); .* needs \(C,H,W\)"):
        apply_preprocess(torch.zeros(10), Preprocess(input_size=(1, 2, 5)), source="t")
    with pytest.raises(DataError, match="mean has 2 values"):
        apply_preprocess(torch.zeros(3, 2, 2), Preprocess(mean=(0.1, 0.2), std=(1.0,)), source="t")
    with pytest.raises(DataError, match="interpolation 'lanczos'"):
        apply_preprocess(torch.zeros(1, 2, 2), Preprocess(input_size=(1, 4, 4), interpolation="lanczos"), source="t")
    assert issubclass(DataError, InputError)


# ---------------------------------------------------------------- links, 16-bit images, data roots


GREY = Preprocess(input_size=(1, 8, 8))


def _image_folder(base: Path, classes=("c0", "c1"), per_class: int = 3) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in classes:
        (base / "train" / c).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (8, 8)).astype(np.uint8)).save(base / "train" / c / f"{i}.png")


@pytest.mark.parametrize("links", [["c0/loop"], ["c0/loop", "c1/loop"]])
def test_a_folder_link_back_into_the_data_is_refused(tmp_path, links):
    """`ln -s .. train/c0/loop` counted c1's images again under c0 (246 samples from 6); two
    such loops never ended."""
    _image_folder(tmp_path)
    for link in links:
        (tmp_path / "train" / link).symlink_to("..")
    with pytest.raises(DataError, match=r"train/c0/loop is a link to folder .*inside the data folder"):
        create_dataset(f"imagefolder:{tmp_path}", preprocess=GREY)


@pytest.mark.parametrize("link, to", [("train/c2", "c0"), ("train/c1/sub", "../c0"), ("test", "train"),
                                      ("train/c0/deep/er", "../../c1")])
def test_a_folder_link_into_the_data_is_refused_at_every_level(tmp_path, link, to):
    """`ln -s c0 train/c2` (a class folder that is its sibling) made 9 samples from 6 images,
    exit 0, while the same link one level deeper was refused; a split folder linked to another
    split would measure the one under the other's name."""
    _image_folder(tmp_path)
    (tmp_path / "train" / "c0" / "deep").mkdir()
    (tmp_path / link).symlink_to(to)
    target = (tmp_path / link).resolve()
    split = "test" if link == "test" else "train"
    with pytest.raises(DataError) as info:
        create_dataset(f"imagefolder:{tmp_path}", split=split, preprocess=GREY)
    message = str(info.value)
    assert "\n" not in message and f"{tmp_path / link} is a link to folder {target}" in message
    assert "inside the data folder" in message


def test_two_class_folders_linked_to_one_folder_out_of_the_data_are_refused(tmp_path):
    """Each class folder's walk had its own record of the folders it saw: two classes that are
    links to one folder elsewhere read its images twice, under two labels."""
    data, store = tmp_path / "data", tmp_path / "store"
    _image_folder(data)
    _image_folder(store, classes=("extra",), per_class=2)
    (data / "train" / "c2").symlink_to(store / "train" / "extra")
    assert len(create_dataset(f"imagefolder:{data}", preprocess=GREY)) == 8
    (data / "train" / "c3").symlink_to(store / "train" / "extra")
    with pytest.raises(DataError, match=r"train/c3 leads to folder .*store/train/extra a second time"):
        create_dataset(f"imagefolder:{data}", preprocess=GREY)


def test_a_folder_link_out_of_the_data_is_followed(tmp_path):
    data, store = tmp_path / "data", tmp_path / "store"
    _image_folder(data)
    _image_folder(store, classes=("extra",), per_class=2)
    (data / "train" / "c0" / "more").symlink_to(store / "train" / "extra")
    assert len(create_dataset(f"imagefolder:{data}", preprocess=GREY)) == 8
    # a loop out there (a folder holding a link to its parent) is told, not walked forever
    (store / "train" / "extra" / "up").symlink_to("..")
    with pytest.raises(DataError, match=r"more/up/extra leads to folder .*store/train/extra a second time \(a symlink loop"):
        create_dataset(f"imagefolder:{data}", preprocess=GREY)


@pytest.mark.parametrize("channels", [1, 3])
def test_16_bit_png_is_scaled_by_its_bit_depth(tmp_path, channels):
    """A 16-bit grey PNG went through convert("L"), which clips at 255: every pixel above
    0.4 % of full scale read as 1.0. The same picture in 8 and in 16 bits reads the same."""
    from PIL import Image

    pixels = np.random.default_rng(1).integers(0, 256, (8, 8)).astype(np.uint8)
    for bits, (folder, arr) in ((8, ("a", pixels)), (16, ("b", pixels.astype(np.uint16) * 257))):
        (tmp_path / folder / "c").mkdir(parents=True)
        Image.fromarray(arr).save(tmp_path / folder / "c" / "x.png")
    size = (channels, 8, 8)
    eight = create_dataset(f"imagefolder:{tmp_path / 'a'}", preprocess=Preprocess(input_size=size))[0][0]
    sixteen = create_dataset(f"imagefolder:{tmp_path / 'b'}", preprocess=Preprocess(input_size=size))[0][0]
    assert torch.equal(eight, sixteen) and eight.shape == size
    assert 0.0 < float(sixteen.min()) or float(sixteen.max()) < 1.0


def test_the_sources_that_need_a_root_are_known_without_torch():
    """data.roots lists them for the entry point's check before torch is imported: every
    registered source that asks for a root, and no other."""
    from flatcheck.data.roots import NEEDS_ROOT, argv_data_problem, missing_root

    needing = []
    for name in list_datasets():
        if registry._REGISTRY[name].takes_path:
            continue
        try:
            create_dataset(name, root=None, preprocess=GREY, num_classes=10)
        except DataError as exc:
            if "needs a data root" in str(exc):
                needing.append(name)
    assert sorted(needing) == sorted(NEEDS_ROOT)
    assert "--data-root" in missing_root("cifar10", None) and missing_root("digits", None) is None
    assert "does not exist" in argv_data_problem(["--data=CIFAR10", "--data-root", "/nonexistent/x"])
    assert argv_data_problem(["--samples", "3"]) is None


@pytest.mark.parametrize("kind", ["imagefolder", "npz"])
def test_a_missing_data_path_is_told_early_in_the_sources_words(tmp_path, kind):
    from flatcheck.data.roots import argv_data_problem

    uri = f"{kind}:{tmp_path / 'nope'}"
    with pytest.raises(DataError) as said:
        create_dataset(uri)
    assert argv_data_problem(["--data", uri]) == str(said.value)


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("name", ["cifar10", "cifar100", "mnist", "fashion-mnist", "svhn"])
@pytest.mark.parametrize("held", ["nothing", "some"])
def test_a_root_lacking_the_sets_files_is_told_early_in_the_sources_words(tmp_path, name, split, held):
    """The entry point's check (no torch) names the same missing files as the source itself:
    an empty root, or one holding a part (the other split's file, a gzipped idx file)."""
    from flatcheck.data.roots import IDX_FILES, argv_data_problem, missing_root

    other = "test" if split == "train" else "train"
    if held == "some":
        for part in {"cifar10": [f"cifar-10-batches-py/{'test_batch' if other == 'test' else 'data_batch_1'}"],
                     "cifar100": [f"cifar-100-python/{other}"],
                     "mnist": [f"MNIST/raw/{IDX_FILES[0]}.gz", f"MNIST/raw/{IDX_FILES[1]}"],
                     "fashion-mnist": [f"FashionMNIST/raw/{IDX_FILES[2]}"], "svhn": [f"{other}_32x32.mat"]}[name]:
            (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / part).write_bytes(b"x")
    with pytest.raises(DataError) as said:
        create_dataset(name, root=tmp_path, split=split, preprocess=GREY, num_classes=10)
    assert missing_root(name, str(tmp_path), split) == str(said.value)
    assert argv_data_problem(["--data", name, "--data-root", str(tmp_path), f"--split={split}"]) == str(said.value)


@pytest.mark.parametrize("split, where", [("train", "train"), ("test", "test"), ("test", "train")])
def test_a_class_folder_link_that_leads_nowhere_is_refused(tmp_path, split, where):
    """`ln -s nowhere train/broken` beside c0, c1 was skipped: exit 0, and the labels of classes
    after it would shift once the drive it points to is mounted again."""
    _image_folder(tmp_path)
    shutil.copytree(tmp_path / "train", tmp_path / "test")
    (tmp_path / where / "broken").symlink_to(tmp_path / "unmounted" / "broken")
    with pytest.raises(DataError) as info:
        create_dataset(f"imagefolder:{tmp_path}", split=split, preprocess=GREY)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"imagefolder:{tmp_path}: {tmp_path / where / 'broken'} ")
    assert f"link to {tmp_path / 'unmounted' / 'broken'}, which does not exist; expected a class folder" in message


def test_flat_samples_against_an_image_size_are_told_how_to_give_a_flat_one(tmp_path):
    """`--input-size 4` is read as 3,4,4, and the error for 4-value samples said only that they are
    not (C,H,W) images; it now names the flat size that reads them, and how to give it."""
    from flatcheck.models.resolve import parse_input_size

    x = np.random.default_rng(5).random((6, 4))
    f = tmp_path / "flat.npz"
    np.savez(f, x=x, y=np.arange(6) % 3)
    with pytest.raises(DataError) as e:
        create_dataset(f"npz:{f}", preprocess=Preprocess(input_size=parse_input_size("4")))
    assert str(e.value) == (f"data 'npz:{f}' gives samples of shape (4); spec input_size [3,4,4] needs (C,H,W) "
                            "images; flat samples need input_size [4] (--set 'input_size=[4]'; a lone --input-size "
                            "S means 3,S,S)")
    flat = create_dataset(f"npz:{f}", preprocess=Preprocess(input_size=(4,)))  # the size it names reads them
    assert torch.equal(flat[5][0], torch.from_numpy(x[5]))
    with pytest.raises(DataError) as e:  # images are not told to be flattened
        apply_preprocess(torch.zeros(4, 4), Preprocess(input_size=(3, 4, 4)), source="t")
    assert "flat" not in str(e.value)
