"""SGLang's own argument definitions, read from its wheel without importing it (it needs torch).

`sglang.launch_server` builds its argparse parser from two places, and both are read here with
`ast`:

- dataclass-style fields `name: A[T, "help"]` / `A[T, Arg(choices=..., aliases=..., cli_name=...)]`
  of the namespace classes listed in `server_args._INPUT_NAMESPACES` (0.5.23 layout, under
  `sglang/srt/arg_groups/fields/`); a field without help or `Arg`, or with `Arg(no_cli=True)`, is
  not a flag; `bool` fields are switches; `Literal[...]` gives choices;
- explicit `parser.add_argument("--flag", ...)` calls in `server_args.py` (dynamic choices,
  deprecated spellings; older releases register everything this way).

Choice lists named by a constant (`choices=ATTENTION_BACKEND_CHOICES`) are resolved from the
module-level lists of `arg_groups/choices.py`. Two checks SGLang makes after parsing are added
as choices: `--speculative-algorithm` (the `SpeculativeAlgorithm` enum plus its reserved
aliases) and `--speculative-draft-attention-backend` (`DRAFT_ATTENTION_BACKEND_CHOICES`).

`check_argv` then checks a rendered command against the definitions: unknown or misspelt flags
(argparse abbreviations are refused too: write the full name), switches given a value, missing
values, values outside the choices, non-integers for int fields.
"""

from __future__ import annotations

import ast
import difflib
import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

import msgspec

__all__ = [
    "ArgSpec",
    "FlagDef",
    "WheelUnavailable",
    "check_algorithm_constraints",
    "check_argv",
    "check_build_constraints",
    "ddtree_pr_extension",
    "ensure_wheel",
    "spec_from_sources",
    "spec_from_wheel",
    "spec_for_build",
]

SGLANG_VERSION = "0.5.23"
SERVER_ARGS = "sglang/srt/server_args.py"
CHOICES = "sglang/srt/arg_groups/choices.py"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
SPEC_REGISTRY = "sglang/srt/speculative/spec_registry.py"
_SWITCH_ACTIONS = {
    "store_true",
    "store_false",
    "store_const",
    "count",
    "help",
    "version",
    "DeprecatedStoreTrueAction",
    "BooleanOptionalAction",
}


class FlagDef(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # the canonical spelling
    takes_value: bool | None = True  # None: a custom action, the value is optional
    nargs: str | None = None  # "+", "*", "?" or None (one value)
    choices: tuple[str, ...] | None = None  # None: any value
    case_insensitive: bool = False
    type: str | None = None  # "int" | "float" | None
    source: str = ""  # where it is defined, file:line


class ArgSpec(msgspec.Struct, frozen=True, kw_only=True):
    version: str
    flags: dict[str, FlagDef]  # every accepted spelling (aliases too) -> its definition

    def extended(
        self, extra: dict[str, FlagDef], algorithms: Iterable[str] = (), version: str | None = None
    ) -> ArgSpec:
        flags = {**self.flags, **extra}
        algo = flags.get("--speculative-algorithm")
        added = tuple(a.upper() for a in algorithms)
        if algo is not None and algo.choices is not None and added:
            patched = msgspec.structs.replace(algo, choices=tuple(dict.fromkeys(algo.choices + added)))
            flags = {k: (patched if v is algo else v) for k, v in flags.items()}
        return ArgSpec(version=version or self.version, flags=flags)


class WheelUnavailable(Exception):
    """The SGLang wheel could not be found in the cache nor downloaded."""


# ----------------------------------------------------------------------------------------------
# Reading the sources


def _const_str(node: ast.AST) -> str | None:
    """A string literal, an implicit/explicit concatenation of literals or an f-string (help texts)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _const_str(node.left), _const_str(node.right)
        return None if left is None or right is None else left + right
    return None


def _literal_list(node: ast.AST, constants: dict[str, list[str]]) -> list[str] | None:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        out = []
        for elt in node.elts:
            if isinstance(elt, ast.Constant) and isinstance(elt.value, (str, int, float)):
                out.append(str(elt.value))
            else:
                return None
        return out
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("list", "set", "sorted")
        and len(node.args) == 1
    ):
        return _literal_list(node.args[0], constants)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal_list(node.left, constants), _literal_list(node.right, constants)
        return None if left is None or right is None else left + right
    return None


def _module_constants(tree: ast.Module) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            values = _literal_list(stmt.value, out)
            if values is not None:
                out[stmt.targets[0].id] = values
    return out


def _name_of(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _unwrap_optional(node: ast.AST) -> ast.AST:
    if isinstance(node, ast.Subscript) and _name_of(node.value) == "Optional":
        return node.slice
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [s for s in (node.left, node.right) if not (isinstance(s, ast.Constant) and s.value is None)]
        if len(sides) == 1:
            return sides[0]
    return node


def _kwargs(call: ast.Call) -> dict[str, ast.AST]:
    return {k.arg: k.value for k in call.keywords if k.arg}


def _action_kind(action: ast.AST | None) -> tuple[bool | None, bool]:
    """(takes_value, adds a --no- twin) for an argparse `action=`."""
    name = _name_of(action)
    if name is None:
        return True, False
    if name in _SWITCH_ACTIONS:
        return False, name == "BooleanOptionalAction"
    return None, False


def _flags_from_field(stmt: ast.AnnAssign, constants: dict[str, list[str]], where: str) -> list[FlagDef]:
    ann = stmt.annotation
    if not (
        isinstance(stmt.target, ast.Name)
        and isinstance(ann, ast.Subscript)
        and _name_of(ann.value) in ("A", "Annotated")
        and isinstance(ann.slice, ast.Tuple)
        and len(ann.slice.elts) >= 2
    ):
        return []
    typ, *meta = ann.slice.elts
    arg: ast.Call | None = None
    has_help = False
    for m in meta:
        if isinstance(m, ast.Call) and _name_of(m.func) == "Arg":
            arg = m
            break
        if _const_str(m) is not None:
            has_help = True
            break
    if arg is None and not has_help:
        return []  # no CLI metadata: SGLang skips the field
    kw = _kwargs(arg) if arg is not None else {}
    no_cli = kw.get("no_cli")
    if isinstance(no_cli, ast.Constant) and no_cli.value is True:
        return []
    field = stmt.target.id
    cli_name = _const_str(kw["cli_name"]) if "cli_name" in kw else None
    names = [cli_name or "--" + field.replace("_", "-")]
    if "aliases" in kw:
        names += _literal_list(kw["aliases"], {}) or []
    inner = _unwrap_optional(typ)
    choices = _literal_list(kw["choices"], constants) if "choices" in kw else None
    nargs = _const_str(kw["nargs"]) if "nargs" in kw else None
    type_name = _name_of(inner) if isinstance(inner, (ast.Name, ast.Attribute)) else None
    twin = False
    if "action" in kw:
        takes_value, twin = _action_kind(kw["action"])
    elif type_name == "bool":
        takes_value = False
    else:
        takes_value = True
        if isinstance(inner, ast.Subscript) and _name_of(inner.value) == "Literal":
            elts = inner.slice.elts if isinstance(inner.slice, ast.Tuple) else [inner.slice]
            literal = [str(e.value) for e in elts if isinstance(e, ast.Constant)]
            choices = choices or literal
        elif isinstance(inner, ast.Subscript) and _name_of(inner.value) in ("list", "List") and "type_parser" not in kw:
            nargs = nargs or "+"
    typ_s = type_name if type_name in ("int", "float") and "type_parser" not in kw else None
    source = f"{where}:{stmt.lineno}"
    defs = [
        FlagDef(
            name=names[0],
            takes_value=takes_value,
            nargs=nargs,
            choices=tuple(choices) if choices is not None else None,
            type=typ_s,
            source=source,
        )
    ]
    if twin:
        defs.append(FlagDef(name="--no-" + names[0][2:], takes_value=False, source=source))
    return [*defs, *(msgspec.structs.replace(defs[0], name=n) for n in names[1:])]


def _flags_from_add_argument(tree: ast.Module, constants: dict[str, list[str]], where: str) -> list[FlagDef]:
    out: list[FlagDef] = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
        ):
            continue
        names = [
            a.value
            for a in node.args
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--")
        ]
        if not names:
            continue
        kw = _kwargs(node)
        takes_value, twin = _action_kind(kw.get("action"))
        choices = _literal_list(kw["choices"], constants) if "choices" in kw else None
        nargs_node = kw.get("nargs")
        nargs = nargs_node.value if isinstance(nargs_node, ast.Constant) else None
        typ = _name_of(kw.get("type"))
        base = FlagDef(
            name=names[0],
            takes_value=takes_value,
            nargs=str(nargs) if nargs is not None else None,
            choices=tuple(choices) if choices is not None else None,
            type=typ if typ in ("int", "float") else None,
            source=f"{where}:{node.lineno}",
        )
        out += [msgspec.structs.replace(base, name=n) for n in names]
        if twin:
            out.append(FlagDef(name="--no-" + names[0][2:], takes_value=False, source=base.source))
    return out


def _namespace_classes(tree: ast.Module) -> dict[str, str] | None:
    """`_INPUT_NAMESPACES` of server_args.py: class name -> file of the module that defines it."""
    names: list[str] | None = None
    for stmt in tree.body:
        if (
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in stmt.targets)
            and isinstance(stmt.value, (ast.List, ast.Tuple))
        ):
            names = [e.id for e in stmt.value.elts if isinstance(e, ast.Name)]
    if names is None:
        return None
    modules: dict[str, str] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module:
            for alias in stmt.names:
                modules[alias.asname or alias.name] = stmt.module.replace(".", "/") + ".py"
    return {n: modules.get(n, SERVER_ARGS) for n in names}


def _algorithm_choices(files: dict[str, str]) -> list[str] | None:
    if SPEC_INFO not in files:
        return None
    names: list[str] = []
    for node in ast.walk(ast.parse(files[SPEC_INFO])):
        if isinstance(node, ast.ClassDef) and node.name == "SpeculativeAlgorithm":
            for stmt in node.body:
                if isinstance(stmt, ast.Assign):
                    names += [t.id for t in stmt.targets if isinstance(t, ast.Name) and t.id.isupper()]
    if not names:
        return None
    aliases: list[str] = []
    if SPEC_REGISTRY in files:
        for stmt in ast.parse(files[SPEC_REGISTRY]).body:
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "_RESERVED_ALIASES" for t in stmt.targets
            ):
                value = stmt.value
                if isinstance(value, ast.Call) and value.args:
                    value = value.args[0]
                aliases = _literal_list(value, {}) or []
    return [n for n in names if n != "NONE"] + aliases


def spec_from_sources(files: dict[str, str], version: str = "unknown") -> ArgSpec:
    """Definitions from source texts keyed by their path inside the wheel (`sglang/srt/...`)."""
    if SERVER_ARGS not in files:
        raise ValueError(f"{SERVER_ARGS} is missing")
    constants: dict[str, list[str]] = {}
    for path in [CHOICES, *sorted(files)]:
        if path in files and path.endswith(".py"):
            for k, v in _module_constants(ast.parse(files[path])).items():
                constants.setdefault(k, v)
    server_tree = ast.parse(files[SERVER_ARGS])
    defs: list[FlagDef] = []
    classes = _namespace_classes(server_tree)
    if classes is None:  # older layout: ServerArgs' own fields only
        classes = {"ServerArgs": SERVER_ARGS}
    parsed: dict[str, ast.Module] = {SERVER_ARGS: server_tree}
    for cls, path in classes.items():
        if path not in files:
            raise ValueError(f"{path} (defines {cls}) is missing")
        tree = parsed.setdefault(path, ast.parse(files[path]))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        defs += _flags_from_field(stmt, constants, path)
    for node in server_tree.body:  # fields declared on ServerArgs itself
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs" and "ServerArgs" not in classes:
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    defs += _flags_from_field(stmt, constants, SERVER_ARGS)
    defs += _flags_from_add_argument(server_tree, constants, SERVER_ARGS)
    flags = {d.name: d for d in defs}
    algo = flags.get("--speculative-algorithm")
    if algo is not None and algo.choices is None and (choices := _algorithm_choices(files)):
        flags["--speculative-algorithm"] = msgspec.structs.replace(algo, choices=tuple(choices), case_insensitive=True)
    draft = flags.get("--speculative-draft-attention-backend")
    if draft is not None and draft.choices is None and "DRAFT_ATTENTION_BACKEND_CHOICES" in constants:
        flags["--speculative-draft-attention-backend"] = msgspec.structs.replace(
            draft, choices=tuple(constants["DRAFT_ATTENTION_BACKEND_CHOICES"])
        )
    return ArgSpec(version=version, flags=flags)


def _srt_sources(members: Iterable[str]) -> dict[str, str]:
    """The `sglang/srt/` Python members of an archive by their path below the package root -> member name."""
    names: dict[str, str] = {}
    for m in members:
        i = m.find("sglang/")
        if m.endswith(".py") and i >= 0 and "sglang/srt/" in m:
            names.setdefault(m[i:], m)
    return names


def _wanted(rel: str) -> bool:
    return rel in {SERVER_ARGS, CHOICES, SPEC_INFO, SPEC_REGISTRY} or rel.startswith("sglang/srt/arg_groups/")


def _read_sources(path: Path) -> dict[str, str]:
    """What `spec_from_sources` reads, from a wheel (zip) or an sdist (tar.gz), by path below the package root."""
    if path.suffix == ".whl" or zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            return {rel: z.read(m).decode("utf-8") for rel, m in _srt_sources(z.namelist()).items() if _wanted(rel)}
    files: dict[str, str] = {}
    with tarfile.open(path) as t:
        for rel, m in _srt_sources(t.getnames()).items():
            if _wanted(rel) and (f := t.extractfile(m)) is not None:
                files[rel] = f.read().decode("utf-8")
    return files


def spec_from_wheel(path: str | Path) -> ArgSpec:
    files = _read_sources(Path(path))
    version = Path(path).name.split("-")[1] if Path(path).name.count("-") >= 1 else "unknown"
    return spec_from_sources(files, version)


def ddtree_pr_extension() -> tuple[dict[str, FlagDef], list[str], str]:
    """Flags and algorithms a DDTree PR build adds (tools/launch/ddtree_pr_flags.toml), and its source."""
    path = Path(str(resources.files("tools.launch") / "ddtree_pr_flags.toml"))
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    flags = {
        name: FlagDef(
            name=name,
            takes_value=bool(d.get("takes_value", True)),
            type=d.get("type"),
            source=f"{path.name}: {data['source']}",
        )
        for name, d in data.get("flags", {}).items()
    }
    return flags, list(data.get("algorithms", {}).get("added", [])), data["source"]


def spec_for_build(release: ArgSpec, build: str) -> ArgSpec:
    """The definitions a recipe's `build` is checked against."""
    if build == "release":
        return release
    if build == "ddtree-pr":
        flags, algorithms, _ = ddtree_pr_extension()
        return release.extended(flags, algorithms, version=f"{release.version}+ddtree-pr")
    raise ValueError(f"unknown build {build!r}")


# ----------------------------------------------------------------------------------------------
# Checking a command


def _suggest(flag: str, spec: ArgSpec) -> str:
    close = difflib.get_close_matches(flag, list(spec.flags), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _check_value(flag: FlagDef, value: str) -> str | None:
    if flag.choices is not None:
        ok = (value.upper() in {c.upper() for c in flag.choices}) if flag.case_insensitive else value in flag.choices
        if not ok:
            return f"{flag.name} {value}: not one of SGLang's choices {list(flag.choices)}"
    if flag.type == "int":
        try:
            int(value)
        except ValueError:
            return f"{flag.name} {value}: expected an integer"
    if flag.type == "float":
        try:
            float(value)
        except ValueError:
            return f"{flag.name} {value}: expected a number"
    return None


def check_argv(argv: list[str], spec: ArgSpec) -> list[str]:
    """Problems of a `sglang.launch_server` command line against `spec`; empty when it parses."""
    args = list(argv)
    if "-m" in args[:3]:
        args = args[args.index("-m") + 2 :]
    problems: list[str] = []
    seen: set[str] = set()
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not token.startswith("--"):
            problems.append(f"{token!r}: a value without a flag")
            continue
        name, eq, inline = token.partition("=")
        flag = spec.flags.get(name)
        if flag is None:
            problems.append(f"{name}: not an argument of SGLang {spec.version}{_suggest(name, spec)}")
            while i < len(args) and not args[i].startswith("--"):
                i += 1
            continue
        if flag.name in seen:
            problems.append(f"{name}: given twice")
        seen.add(flag.name)
        values: list[str] = [inline] if eq else []
        if not eq:
            while i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
        if flag.takes_value is False:
            if values:
                problems.append(f"{name}: a switch, takes no value (got {' '.join(values)!r})")
            continue
        if flag.takes_value is None and not values:
            continue
        if flag.nargs in ("+", "*"):
            if not values and flag.nargs == "+":
                problems.append(f"{name}: expects one or more values")
        elif flag.nargs == "?":
            if len(values) > 1:
                problems.append(f"{name}: takes at most one value (got {' '.join(values)!r})")
        elif len(values) != 1:
            problems.append(f"{name}: expects one value (got {len(values)})")
        problems += [p for v in values if (p := _check_value(flag, v))]
    return problems


# ----------------------------------------------------------------------------------------------
# The wheel


def cache_dir() -> Path:
    base = os.environ.get("SPECROUTE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specroute"
    )
    return Path(base) / "wheels"


def ensure_wheel(version: str = SGLANG_VERSION, directory: Path | None = None, timeout_s: float = 300.0) -> Path:
    """The cached `sglang==version` wheel, downloaded once with `pip download --no-deps`.

    The argument definitions are pure Python and the same in every platform's wheel, so one
    platform is asked for explicitly: the download is the same on any host.
    """
    directory = directory or cache_dir()
    found = sorted(directory.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    directory.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--quiet",
        "--only-binary=:all:",
        "--platform",
        "manylinux_2_34_x86_64",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        f"sglang=={version}",
        "-d",
        str(directory),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise WheelUnavailable(f"pip download sglang=={version} failed: {e}") from None
    found = sorted(directory.glob(f"sglang-{version}-*.whl"))
    if proc.returncode != 0 or not found:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise WheelUnavailable(f"pip download sglang=={version} failed: {last[0]}")
    return found[0]


# Attention backends that force a page size above 1 (sglang/srt/arg_groups/overrides.py, 0.5.23).
_PAGED_BACKENDS = ("trtllm_mla", "cutedsl_mla", "flashmla", "trtllm_mha", "hpc_ops")


def _value_of(argv: list[str], flag: str) -> str | None:
    for i, token in enumerate(argv):
        name, eq, inline = token.partition("=")
        if name == flag:
            if eq:
                return inline
            return argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else ""
    return None


def check_build_constraints(argv: list[str], build: str) -> list[str]:
    """What a build needs beyond parsing: the DDTree PR build runs only with page size 1."""
    if build != "ddtree-pr":
        return []
    path = Path(str(resources.files("tools.launch") / "ddtree_pr_flags.toml"))
    constraints = tomllib.loads(path.read_text(encoding="utf-8")).get("constraints", {})
    problems = [
        f"{flag}: the DDTree build does not support it"
        for flag in constraints.get("incompatible_flags", [])
        if _value_of(argv, flag) is not None
    ]
    want = constraints.get("page_size")
    page = _value_of(argv, "--page-size")
    if want is not None and page is None:
        problems.append(f"--page-size {want}: required by the DDTree build (some attention backends force another)")
    elif want is not None and page != str(want):
        problems.append(f"--page-size {page}: the DDTree build supports only page size {want}")
    backend = _value_of(argv, "--attention-backend")
    if backend in _PAGED_BACKENDS:
        problems.append(f"--attention-backend {backend}: forces a page size above 1, which the DDTree build refuses")
    return problems


def _int_value(argv: list[str], flag: str, default: int) -> int:
    value = _value_of(argv, flag)
    try:
        return int(value) if value else default
    except ValueError:
        return default  # check_argv reports the non-integer


def check_algorithm_constraints(argv: list[str]) -> list[str]:
    """Start-up refusals of SGLang 0.5.23's speculative hooks that parsing alone does not catch
    (`arg_groups/speculative_hook.py`: `_handle_ngram`, `_handle_dflash`), in SGLang's words."""
    algorithm = (_value_of(argv, "--speculative-algorithm") or "").upper()
    problems: list[str] = []
    backend = _value_of(argv, "--attention-backend")
    dp = _int_value(argv, "--attn-dp-size", 1) > 1 or (
        _value_of(argv, "--enable-dp-attention") is not None and _int_value(argv, "--dp-size", 1) > 1
    )
    if algorithm == "NGRAM":
        topk = _int_value(argv, "--speculative-ngram-max-bfs-breadth", 10)
        page = 64 if backend == "trtllm_mla" else _int_value(argv, "--page-size", 1)
        if topk > 1 and page > 1 and backend != "flashinfer":
            problems.append(
                f"--speculative-ngram-max-bfs-breadth {topk}: speculative_eagle_topk({topk}) > 1 with "
                f"page_size({page}) > 1 is unstable and produces incorrect results for paged attention "
                "backends. This combination is only supported for the 'flashinfer' backend."
            )
        if dp:
            problems.append("Currently ngram speculative decoding does not support dp attention.")
    if algorithm == "DFLASH":
        window = _value_of(argv, "--speculative-draft-window-size")
        block = _value_of(argv, "--speculative-dflash-block-size") or _value_of(argv, "--speculative-num-draft-tokens")
        if window and block and window.isdigit() and block.isdigit() and int(window) < int(block):
            problems.append(
                "--speculative-draft-window-size must be >= --speculative-num-draft-tokens (block_size). "
                f"window_size={window}, block_size={block}."
            )
        if dp and _value_of(argv, "--enable-dp-lm-head") is None:
            problems.append("DFLASH with dp attention requires --enable-dp-lm-head.")
    return problems
