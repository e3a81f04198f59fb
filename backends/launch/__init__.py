"""Launching the real SGLang servers of the studies: profiles as data, checked against SGLang itself.

- `profile`: launch profiles (`profiles/*.toml`), rendered to a `python -m sglang.launch_server` line;
- `sglang_args`: SGLang's argument definitions read from its wheel, and a checker for a command;
- `systemd`: a unit file for a profile; `run`: preflight and exec on a GPU host;
- `probe`: what a live server reports, as the gateway will see it.
"""

from backends.launch.profile import (
    LaunchArg,
    LaunchOptions,
    LaunchProfile,
    ProfileError,
    command,
    environment,
    explained,
    list_profiles,
    load_profile,
    profile_names,
    rendered_args,
    server_argv,
    shell_line,
)

__all__ = [
    "LaunchArg",
    "LaunchOptions",
    "LaunchProfile",
    "ProfileError",
    "command",
    "environment",
    "explained",
    "list_profiles",
    "load_profile",
    "profile_names",
    "rendered_args",
    "server_argv",
    "shell_line",
]
