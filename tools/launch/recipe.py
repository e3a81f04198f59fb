"""Launch recipes: how to start the real SGLang servers of the studies, as data.

A recipe (`recipes/NAME.toml`) lists the `sglang.launch_server` arguments of one seed system,
each with a one-line reason (`why`). `recipes/_common.toml` holds the arguments every recipe
gets (model path, served name, host, port, metrics, tracing). Rendering fills the placeholders
(`{model_path}`, `{port}`, `{ddtree_budget}`, ...) from the recipe and from `LaunchOptions`.
"""

from __future__ import annotations

import dataclasses
import shlex
import string
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from backends.descriptor import Strategy

__all__ = [
    "LaunchArg",
    "LaunchOptions",
    "LaunchRecipe",
    "RecipeError",
    "list_recipes",
    "load_recipe",
    "recipe_names",
]

SGLANG_MODULE = "sglang.launch_server"
BUILDS = ("release", "ddtree-pr")
_T = TypeVar("_T")


class RecipeError(Exception):
    """A launch recipe that cannot be loaded or rendered, phrased for the operator."""


class LaunchArg(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    flag: str
    # None or true: a bare switch. A list: several values after one flag.
    value: str | int | float | bool | list[str | int] | None = None
    why: str
    group: str | None = None  # "trace": dropped by LaunchOptions(trace=False)


class _Common(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    head: list[LaunchArg] = []
    tail: list[LaunchArg] = []


class LaunchRecipe(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    description: str
    strategy: Strategy
    served_model_name: str
    model_path: str
    gpus: int  # GPUs the server needs (its tensor-parallel size)
    build: str = "release"  # release: sglang==0.5.23 | ddtree-pr: a build with DDTree
    notes: str | None = None
    params: dict[str, str | int | float] = {}
    env: dict[str, str] = {}
    args: list[LaunchArg] = []


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """What an operator may change at launch time without editing a recipe."""

    model_path: str | None = None
    host: str = "0.0.0.0"
    port: int = 30000
    gpus: tuple[int, ...] | None = None  # CUDA_VISIBLE_DEVICES; its length must equal the recipe's gpus
    otlp_endpoint: str = "localhost:4317"
    trace: bool = True
    ddtree_budget: int | None = None
    python: str = "python"


def _recipes_dir() -> Path:
    return Path(str(resources.files("tools.launch") / "recipes"))


def recipe_names() -> list[str]:
    return sorted(p.stem for p in _recipes_dir().glob("*.toml") if not p.stem.startswith("_"))


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise RecipeError(f"{path}: cannot read ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise RecipeError(f"{path}: not valid TOML: {e}") from None


def _convert(data: dict[str, Any], typ: type[_T], where: str) -> _T:
    try:
        return msgspec.convert(data, typ)
    except msgspec.ValidationError as e:
        raise RecipeError(f"{where}: {e}") from None


def load_recipe(name_or_path: str) -> LaunchRecipe:
    """A recipe by name (see `recipe_names()`) or by path to a `.toml` file."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = _recipes_dir() / f"{name_or_path}.toml"
        if not path.is_file():
            raise RecipeError(f"unknown launch recipe {name_or_path!r}; known: {', '.join(recipe_names())}")
    recipe = _convert(_read_toml(path), LaunchRecipe, str(path))
    _validate(recipe, str(path))
    common = _common()
    clash = {a.flag for a in [*common.head, *common.tail]} & {a.flag for a in recipe.args}
    if clash:
        raise RecipeError(f"{path}: {', '.join(sorted(clash))} come from _common.toml; use the launch options")
    return recipe


def list_recipes() -> list[LaunchRecipe]:
    return [load_recipe(n) for n in recipe_names()]


def _common() -> _Common:
    path = _recipes_dir() / "_common.toml"
    common = _convert(_read_toml(path), _Common, str(path))
    for arg in [*common.head, *common.tail]:
        _validate_arg(arg, str(path))
    return common


def _validate_arg(arg: LaunchArg, where: str) -> None:
    if not arg.flag.startswith("--") or len(arg.flag) < 3 or "=" in arg.flag or " " in arg.flag:
        raise RecipeError(f"{where}: {arg.flag!r}: expected a long option such as --tp-size")
    if not arg.why.strip():
        raise RecipeError(f"{where}: {arg.flag}: every argument needs a one-line reason in `why`")
    if arg.value is False:
        raise RecipeError(f"{where}: {arg.flag}: drop a switch instead of setting it to false")


def _validate(recipe: LaunchRecipe, where: str) -> None:
    if recipe.build not in BUILDS:
        raise RecipeError(f"{where}: build: expected one of {list(BUILDS)}, got {recipe.build!r}")
    if recipe.gpus < 1:
        raise RecipeError(f"{where}: gpus: expected >= 1, got {recipe.gpus}")
    seen: set[str] = set()
    for arg in recipe.args:
        _validate_arg(arg, where)
        if arg.flag in seen:
            raise RecipeError(f"{where}: {arg.flag} appears twice")
        seen.add(arg.flag)


def _placeholders(recipe: LaunchRecipe, options: LaunchOptions) -> dict[str, str]:
    values: dict[str, Any] = dict(recipe.params)
    if options.ddtree_budget is not None:
        if "ddtree_budget" not in recipe.params:
            raise RecipeError(f"{recipe.name}: --ddtree-budget applies to DDTree recipes only")
        if options.ddtree_budget < 1:
            raise RecipeError(f"{recipe.name}: --ddtree-budget must be >= 1, got {options.ddtree_budget}")
        values["ddtree_budget"] = options.ddtree_budget
    values.update(
        model_path=options.model_path or recipe.model_path,
        served_model_name=recipe.served_model_name,
        host=options.host,
        port=options.port,
        otlp_endpoint=options.otlp_endpoint,
    )
    return {k: str(v) for k, v in values.items()}


def _fill(text: str, values: dict[str, str], recipe: LaunchRecipe) -> str:
    try:
        for _, field, _, _ in string.Formatter().parse(text):
            if field is not None and field not in values:
                raise RecipeError(f"{recipe.name}: unknown placeholder {{{field}}} in {text!r}")
        return text.format_map(values)
    except ValueError as e:
        raise RecipeError(f"{recipe.name}: bad placeholder in {text!r}: {e}") from None


def rendered_args(recipe: LaunchRecipe, options: LaunchOptions | None = None) -> list[tuple[LaunchArg, list[str]]]:
    """Every argument in command-line order with its rendered tokens (flag first)."""
    options = options or LaunchOptions()
    values = _placeholders(recipe, options)
    common = _common()
    out: list[tuple[LaunchArg, list[str]]] = []
    for arg in [*common.head, *recipe.args, *common.tail]:
        if arg.group == "trace" and not options.trace:
            continue
        if arg.value is None or arg.value is True:
            tokens = [arg.flag]
        elif isinstance(arg.value, list):
            tokens = [arg.flag, *(_fill(str(v), values, recipe) for v in arg.value)]
        else:
            tokens = [arg.flag, _fill(str(arg.value), values, recipe)]
        out.append((arg, tokens))
    return out


def server_argv(recipe: LaunchRecipe, options: LaunchOptions | None = None) -> list[str]:
    """The arguments after `python -m sglang.launch_server`."""
    return [t for _, tokens in rendered_args(recipe, options) for t in tokens]


def command(recipe: LaunchRecipe, options: LaunchOptions | None = None) -> list[str]:
    options = options or LaunchOptions()
    return [options.python, "-m", SGLANG_MODULE, *server_argv(recipe, options)]


def environment(recipe: LaunchRecipe, options: LaunchOptions | None = None) -> dict[str, str]:
    """Variables the server needs on top of the caller's environment."""
    options = options or LaunchOptions()
    env = dict(recipe.env)
    if options.gpus is not None:
        if len(options.gpus) != recipe.gpus:
            raise RecipeError(
                f"{recipe.name} needs {recipe.gpus} GPU(s) (tensor parallel {recipe.gpus}); "
                f"--gpus names {len(options.gpus)}"
            )
        if len(set(options.gpus)) != len(options.gpus):
            raise RecipeError(f"--gpus names a GPU twice: {','.join(map(str, options.gpus))}")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in options.gpus)
    return env


def shell_line(recipe: LaunchRecipe, options: LaunchOptions | None = None) -> str:
    """The exact command as one shell line, environment assignments first."""
    env = environment(recipe, options)
    prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    return " ".join([*prefix, *(shlex.quote(t) for t in command(recipe, options))])


def explained(recipe: LaunchRecipe, options: LaunchOptions | None = None) -> str:
    """The command as a bash script, one argument per line with its reason as a comment."""
    options = options or LaunchOptions()
    env = environment(recipe, options)
    lines = ["#!/usr/bin/env bash", f"# {recipe.name}: {recipe.description}"]
    if recipe.build != "release":
        lines.append("# needs an SGLang build with DDTree support (not in a release)")
    if recipe.notes:
        lines.append(f"# note: {recipe.notes}")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    rendered = rendered_args(recipe, options)
    texts = [" ".join(shlex.quote(t) for t in tokens) for _, tokens in rendered]
    width = max(map(len, texts))
    lines.append("args=(")
    lines += [f"  {text:<{width}}  # {arg.why}" for text, (arg, _) in zip(texts, rendered, strict=True)]
    lines.append(")")
    lines.append(f'exec {shlex.quote(options.python)} -m {SGLANG_MODULE} "${{args[@]}}"')
    return "\n".join(lines)
