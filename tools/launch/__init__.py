"""Launching the real SGLang servers of the studies: recipes as data, checked against SGLang itself.

- `recipe`: launch recipes (`recipes/*.toml`), rendered to a `python -m sglang.launch_server` line;
- `sglang_args`: SGLang's argument definitions read from its wheel, and a checker for a command;
- `systemd`: a unit file for a recipe; `run`: preflight and exec on a GPU host;
- `probe`: what a live server reports, as the gateway will see it.
"""

from tools.launch.recipe import (
    LaunchArg,
    LaunchOptions,
    LaunchRecipe,
    RecipeError,
    command,
    environment,
    explained,
    list_recipes,
    load_recipe,
    recipe_names,
    rendered_args,
    server_argv,
    shell_line,
)

__all__ = [
    "LaunchArg",
    "LaunchOptions",
    "LaunchRecipe",
    "RecipeError",
    "command",
    "environment",
    "explained",
    "list_recipes",
    "load_recipe",
    "recipe_names",
    "rendered_args",
    "server_argv",
    "shell_line",
]
