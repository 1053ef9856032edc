"""MkDocs hooks: the pages made from the code, and links to the repository's own files.

- reference/probes.md is written from `flatcheck explain PROBE` for every registered probe (its prose
  and the Options each probe declares), so the reference cannot drift from the command.
- reference/api.md lists every name `flatcheck` exports, at the module that defines it today, for
  mkdocstrings to document from its docstring.
- A page may link a file outside docs/ by its path relative to the page, as it would on a code host
  (`../benchmarks/results/latest.md`); the file is copied into the site under `repo/` and the link
  points there. A link to a file the repository does not hold stays as written, so the strict build
  fails on it.

Nothing is written into docs/: the generated pages exist only in the build.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import posixpath
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
REPO = "repo"  # where files from outside docs/ live in the site
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")
PROBES_PAGE = "reference/probes.md"
API_PAGE = "reference/api.md"


# -- links to the repository's files --------------------------------------------------------

def _outside_target(src_uri: str, link: str) -> str | None:
    """The repository path a page's relative link points at, when it leaves docs/."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", link) or link.startswith("/"):
        return None
    in_docs = posixpath.normpath(posixpath.join(posixpath.dirname(src_uri), link))
    if not in_docs.startswith("../"):
        return None
    in_repo = posixpath.normpath(posixpath.join("docs", posixpath.dirname(src_uri), link))
    return None if in_repo.startswith("../") else in_repo


def _repo_files_linked(pages: dict[str, str]) -> dict[str, Path]:
    """Every file outside docs/ that the pages link, followed through the Markdown files it finds."""
    found: dict[str, Path] = {}
    todo = list(pages.items())
    while todo:
        src_uri, text = todo.pop()
        for match in LINK.finditer(text):
            target = _outside_target(src_uri, match.group(2))
            if src_uri.startswith(REPO + "/") and target is None:  # a repository page's own relative link
                rel = posixpath.normpath(posixpath.join(posixpath.dirname(src_uri), match.group(2)))
                target = rel[len(REPO) + 1:] if rel.startswith(REPO + "/") else None
            if target is None or target in found or target.startswith("docs/"):
                continue
            path = ROOT / target
            if path.is_file():
                found[target] = path
                if path.suffix == ".md":
                    todo.append((f"{REPO}/{target}", path.read_text(encoding="utf-8")))
    return found


def on_page_markdown(markdown: str, page, config, files):  # noqa: ANN001 - MkDocs' signature
    src_uri = page.file.src_uri
    if src_uri.startswith(REPO + "/"):
        return markdown  # a copied file keeps the links it has among its neighbours

    def rewrite(match: re.Match) -> str:
        target = _outside_target(src_uri, match.group(2))
        if target is None or not (ROOT / target).is_file():
            return match.group(0)
        new = posixpath.relpath(f"{REPO}/{target}", posixpath.dirname(src_uri) or ".")
        return f"{match.group(1)}{new}{match.group(3) or ''}{match.group(4)}"

    return LINK.sub(rewrite, markdown)


# -- pages made from the code ----------------------------------------------------------------

def _flatcheck(*argv: str) -> str:
    """stdout of `flatcheck ARGV…`, run in this process through the command's own entry point."""
    from flatcheck.entry import main

    out, saved = io.StringIO(), sys.argv
    sys.argv = ["flatcheck", *argv]
    os.environ.setdefault("COLUMNS", "100")
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main()
    finally:
        sys.argv = saved
    return out.getvalue()


def _md(text: str) -> str:
    """Plain text as Markdown: emphasis, link and table characters escaped outside `code`, and `<`
    written as an entity (Markdown has no escape for it)."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"([*_\[\]|])", r"\\\1", parts[i]).replace("<", "&lt;")
    return "`".join(parts)


KNOB = re.compile(r"^(?P<flags>.+?) \(key (?P<key>\w+)(?:, default (?P<default>[^()]*))?\): (?P<help>.*)$")


def _knob(probe: str, text: str) -> str:
    """One option as `flatcheck explain` words it (FLAGS (key KEY, default D): HELP), in Markdown."""
    match = KNOB.match(text)
    if match is None:
        return _md(text)
    flags = " / ".join(f"`{f.strip()}`" if f.strip().startswith("-") else _md(f.strip())
                       for f in match["flags"].split(" / "))
    default = f", default `{match['default']}`" if match["default"] is not None else ""
    return f"{flags} (`-o {probe}.{match['key']}`{default}): {_md(match['help'])}"


def _sections(text: str) -> list[tuple[str, list[str]]]:
    """`flatcheck explain`'s output as (title, entries): a title at column 0, its body indented
    by two spaces, an entry's continuation lines by more."""
    sections: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            sections.append((line.strip(), []))
        elif line.startswith("   ") and sections[-1][1]:
            sections[-1][1][-1] += " " + line.strip()
        else:
            sections[-1][1].append(line.strip())
    return sections


def probes_page() -> str:
    import flatcheck

    lines = ["# Probe reference", "",
             "Generated at build time from `flatcheck explain PROBE` for every registered probe: its prose "
             "and the options its `Options` declare, with their flags, keys, defaults and help. "
             "`flatcheck explain NAME` prints the same at a terminal. A probe's options are flags of "
             "`flatcheck NAME` and, in `flatcheck probe` and gate files, keys of `-o NAME.KEY=VALUE`.", ""]
    names = list(flatcheck.list_probes())
    lines += ["| probe | what it measures |", "|---|---|"]
    bodies = []
    for name in names:
        sections = _sections(_flatcheck("explain", name))
        if not sections:
            raise RuntimeError(f"`flatcheck explain {name}` printed nothing")
        summary = " ".join(sections[0][1])
        lines.append(f"| [{name}](#{name}) | {_md(summary)} |")
        body = [f"## {name}", "", _md(summary), ""]
        for title, entries in sections[1:]:
            body += [f"**{title}.**" if title != "Options" else "**Options.**", ""]
            if title == "Options":
                knobs: list[str] = []
                for entry in entries:  # a wrapped line of the intro is not a knob: knobs start with their flag
                    if knobs and not entry.startswith(("-", "no flag")):
                        knobs[-1] += " " + entry
                    else:
                        knobs.append(entry)
                intro, knobs = (knobs[0], knobs[1:]) if knobs else ("", [])
                if intro.endswith(" none"):  # a probe without options: the intro, then "none"
                    intro, knobs = intro[:-len(" none")], []
                body += [_md(intro), ""] + [f"- {_knob(name, k)}" for k in knobs] + ([""] if knobs else
                                                                                      ["This probe has no options.", ""])
            else:
                body[-2:] = [f"{body[-2]} {_md(' '.join(entries))}", ""]
        bodies.append("\n".join(body))
    return "\n".join(lines) + "\n\n" + "\n\n".join(bodies) + "\n"


def _signature(shown: str, obj: object) -> list[str]:
    """How the name is called, as a code block (mkdocstrings shows a root object's signature only
    in a heading of its own); one parameter a line when it does not fit a line."""
    try:
        sig = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return []
    def annotation(a: object) -> str:  # postponed annotations are strings: shown as written
        return a.strip("'\"") if isinstance(a, str) else inspect.formatannotation(a)

    params = []
    for p in sig.parameters.values():
        text = p.name if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) else str(p).split(":")[0]
        if p.annotation is not p.empty:
            text += f": {annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {p.default!r}"
        params.append(text)
    if any(p.kind is p.KEYWORD_ONLY for p in sig.parameters.values()) and not any(
            p.kind is p.VAR_POSITIONAL for p in sig.parameters.values()):
        first = next(i for i, p in enumerate(sig.parameters.values()) if p.kind is p.KEYWORD_ONLY)
        params.insert(first, "*")
    returns = sig.return_annotation
    ret = "" if returns is sig.empty or isinstance(obj, type) else f" -> {annotation(returns)}"
    one_line = f"{shown}({', '.join(params)}){ret}"
    text = one_line if len(one_line) <= 96 else shown + "(\n" + "".join(f"    {p},\n" for p in params) + f"){ret}"
    return ["```python", text, "```", ""]


def api_page() -> str:
    import flatcheck

    lines = ["# Python API", "",
             "Generated at build time: every name `flatcheck` exports (`flatcheck.__all__`), documented "
             "from its docstring at the module that defines it. Import them from `flatcheck` itself; "
             "the module paths below are where they live today, not a promise.", ""]
    for name in flatcheck.__all__:
        if name.startswith("__"):
            continue
        obj = getattr(flatcheck, name)
        where = f"{obj.__module__}.{obj.__qualname__}"
        lines += [f"## `flatcheck.{name}`", "", *_signature(f"flatcheck.{name}", obj), f"::: {where}", "    options:",
                  "      show_root_heading: false", "      show_root_toc_entry: false", ""]
    return "\n".join(lines)


def on_files(files: Files, config) -> Files:  # noqa: ANN001 - MkDocs' signature
    sys.path.insert(0, str(ROOT / "src"))
    files.append(File.generated(config, PROBES_PAGE, content=probes_page()))
    files.append(File.generated(config, API_PAGE, content=api_page()))
    pages = {f.src_uri: Path(f.abs_src_path).read_text(encoding="utf-8")
             for f in files if f.src_uri.endswith(".md") and f.abs_src_path}
    for target, path in sorted(_repo_files_linked(pages).items()):
        files.append(File.generated(config, f"{REPO}/{target}", abs_src_path=str(path)))
    return files
