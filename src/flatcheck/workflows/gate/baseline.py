"""The baseline report relative rules compare with: read, and its records checked to be what
their keys say, before any probe runs."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ...errors import ConfigError, InputError
from ...probes.gating import gating_of
from ...probes.registry import get_probe_class
from ..results_io import schema_tuple  # noqa: F401  (gate modules import it from here)


@dataclass(frozen=True)
class Baseline:
    """A report an earlier run wrote (`--json`), whose results relative rules compare with."""

    results: dict[str, Any]
    meta: dict[str, Any]
    where: str  # for messages: the file

    @property
    def schema(self) -> str | None:
        return self.meta.get("schema_version")


def load_baseline(path: str | Path) -> Baseline:
    import json

    where = f"--baseline {path}"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{where}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{where}: is a folder; give a JSON report") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{where}: not a JSON report ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        raise ConfigError(f"{where}: not a flatcheck JSON report (no 'results')")
    if not data["results"]:
        raise ConfigError(f"{where}: the report holds no results; make it with the probes the rules name")
    bad = [k for k, v in data["results"].items() if not isinstance(v, dict)]
    if bad:
        raise ConfigError(f"{where}: results.{bad[0]} is not a probe result (a mapping)")
    meta = {k: v for k, v in data.items() if k not in ("results", "gate")}
    _check_schema(meta.get("schema_version"), where)
    baseline = Baseline(data["results"], meta, where)
    check_records(baseline)
    return baseline


def _check_schema(version: Any, where: str) -> None:
    """Every report flatcheck writes says its schema (from the first, 1.0): one without is not
    its report, or an edited one. A newer one, minor included, may mean other things by the
    same keys (2.3 changed an SLQ probe's stderr, 2.4 what is exact): compared by the flatcheck that
    wrote it, not guessed at."""
    from ...report.result import SCHEMA_VERSION

    if version is None:
        raise ConfigError(f"{where}: no schema_version: not a report flatcheck wrote, or an edited one")
    found = schema_tuple(version)
    if found is None:
        raise ConfigError(f"{where}: schema_version {version!r} is not MAJOR.MINOR")
    if found > schema_tuple(SCHEMA_VERSION):
        raise ConfigError(f"{where}: schema_version {version} is newer than this flatcheck's "
                          f"{SCHEMA_VERSION}; compare with the flatcheck that wrote it")


def check_records(baseline: Baseline) -> None:
    """Each record is the result of the probe it is filed under: its own `probe` field, the
    options that define its quantity (`matrix` and the probe's quantity options, as far as its
    details name them) and its route must be the key's probe's, and the probe's own checks
    must hold (`Gating.check_record`). A record copied under another probe's key would
    otherwise be gated as that probe's value."""
    schema = schema_tuple(baseline.schema)
    for key, record in baseline.results.items():
        if not isinstance(record, Mapping):
            continue
        own = record.get("probe")
        if own is not None and own != key:
            raise InputError(f"{baseline.where}: results.{key} is the result of probe {own!r}, not of {key}: "
                             "another probe's record, or an edited report")
        why = _foreign_quantity(key, record) or gating_of(key).check_record(key, record, schema)
        if why:
            raise InputError(f"{baseline.where}: results.{key}: {why}: another probe's result, or an edited report")


def check_superseded(baseline: Baseline, fields: Mapping[str, Sequence[str]]) -> None:
    """A record of an older schema whose fields the rules read (`fields`: per probe, the paths
    below it) and which this version means otherwise (`Gating.superseded`) is refused: comparing
    the two would gate two quantities as one. A record no rule reads is left alone."""
    schema = schema_tuple(baseline.schema)
    for key, record in baseline.results.items():
        read = fields.get(key)
        if not read or not isinstance(record, Mapping):
            continue
        why = gating_of(key).superseded(key, record, schema, read)
        if why:
            raise InputError(f"{baseline.where}: results.{key}: {why}; measure the baseline again with this version")


def _foreign_quantity(probe: str, record: Mapping[str, Any]) -> str | None:
    """Why the options a record's details name (matrix, the probe's quantity options) are not
    ones `probe` takes: an option it does not have, or a value its Options cannot hold."""
    try:
        options = get_probe_class(probe).Options
    except ConfigError:
        return None  # a probe this flatcheck does not know: no rule can name it either
    details = record.get("details") or {}
    fields = {f.name for f in dataclasses.fields(options)}
    hints = typing.get_type_hints(options)
    for key in ("matrix", *gating_of(probe).quantity_options):
        if key not in details or details[key] is None:
            continue
        if key not in fields:
            return f"details.{key} is {details[key]!r}, and {probe} has no {key} option"
        allowed = _literal_values(hints[key])
        if allowed is not None and details[key] not in allowed:
            return f"details.{key} is {details[key]!r}, not one of {probe}'s ({', '.join(map(str, allowed))})"
    return None


def _literal_values(hint: Any) -> tuple | None:
    """The values a Literal (or Optional Literal) type allows; None for any other type."""
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    literals = [a for a in typing.get_args(hint) if typing.get_origin(a) is typing.Literal]
    return tuple(v for a in literals for v in typing.get_args(a)) if literals else None


# What makes two reports measure the same quantity: the function (architecture, parameters,
# loss, BatchNorm mode, which parameters are probed) and the samples. The checkpoint's hash is
# not among them: a release gate compares new weights with the last release's report, and a
# changed hash is the point; it is shown, so an unchanged model is recognisable.
IDENTITY = (("model", "source"), ("model", "arch"), ("model", "parameters"), ("model", "probed_parameters"),
            ("model", "num_classes"), ("model", "loss"), ("model", "label_smoothing"), ("model", "params_filter"),
            ("bn_mode",), ("data", "name"), ("data", "split"), ("data", "samples"), ("data", "fingerprint"))
_ABSENT = object()


def _lookup(meta: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = meta
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return _ABSENT
        node = node[key]
    return node


def foreign_fields(baseline_meta: Mapping[str, Any], current_meta: Mapping[str, Any]) -> list[str]:
    """'field: baseline → now' for every identity field in which the two reports differ
    (a field the baseline does not hold counts: it cannot be shown to be the same)."""
    out = []
    for path in IDENTITY:
        b, c = _lookup(baseline_meta, path), _lookup(current_meta, path)
        if b is not c and b != c:
            shown = "absent" if b is _ABSENT else repr(b)
            out.append(f"{'.'.join(path)}: {shown} → {c!r}")
    return out
