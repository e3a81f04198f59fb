"""`specroute config ...`: write and check gateway config files.

    specroute config init --from-profiles NAME=URL[,NAME=URL...] [--output FILE] [--force]
                          [--listen HOST:PORT] [--policy NAME] [--otlp-endpoint URL]
    specroute config init --from-urls URL[,URL...] [--api-key-env VAR] [--output FILE] ...
    specroute config check FILE

`--from-profiles`: NAME is a launch recipe (`specroute backends list`) or a twin profile
(`specroute sim --list`): it gives the backend's served model and strategy. `BACKEND:PROFILE=URL`
names the backend differently from its profile, e.g. two DFlash servers
`dflash-a:k26-dflash=...,dflash-b:k26-dflash=...`.

`--from-urls`: any SGLang server of any model. Each is read (`tools.fit.discover`: its served model,
`speculative_algorithm`, cap and context length), its strategy named (`tools.fit.algorithms`), and
the servers grouped by the model they serve. A server that cannot be read or classified is written
commented out, with the reason.

The written file is loaded with `gateway.config` before it is written, so it always starts.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

from gateway.config import (
    Config,
    ConfigError,
    GatewaySection,
    config_from_dict,
    load_config,
    parse_listen,
    url_problem,
)
from tools.cli_usage import UsageError, UsageParser, api_key_from_env

__all__ = ["Backend", "main", "render_config"]

PROG = "specroute config"


def _parser() -> UsageParser:
    p = UsageParser(prog=PROG, description="Write and check gateway config files.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=UsageParser)
    s = sub.add_parser("init", help="write a gateway config for a set of backend URLs")
    source = s.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--from-profiles",
        action="append",
        metavar="NAME=URL[,NAME=URL...]",
        help="backends by launch recipe or twin profile name and base URL; repeatable",
    )
    source.add_argument(
        "--from-urls",
        action="append",
        metavar="URL[,URL...]",
        help="backends read from the running SGLang servers themselves (any model); repeatable",
    )
    s.add_argument("--api-key-env", metavar="VAR", help="--from-urls: the servers' API key is in this variable")
    s.add_argument("--output", "-o", help="file to write (default: standard output)")
    s.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    s.add_argument("--listen", default=GatewaySection().listen, help="gateway HOST:PORT (default %(default)s)")
    s.add_argument("--policy", default=GatewaySection().policy, help="routing policy (default %(default)s)")
    s.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="export the gateway's traces over OTLP/HTTP to this base URL, e.g. http://jaeger:4318",
    )
    s = sub.add_parser("check", help="load a config file as `specroute serve` would and summarise it")
    s.add_argument("file")
    return p


class Backend:
    """One `[[backends]]` entry to write. `notes`: comment lines above it; `disabled`: why it is
    written commented out (None: it is active)."""

    def __init__(
        self,
        name: str,
        profile: str,
        url: str,
        model: str,
        strategy: str,
        source: str,
        *,
        notes: list[str] | None = None,
        disabled: str | None = None,
    ) -> None:
        self.name, self.profile, self.url, self.model, self.strategy, self.source = (
            name,
            profile,
            url,
            model,
            strategy,
            source,
        )
        self.notes = notes or []
        self.disabled = disabled


def _profile_facts(profile: str) -> tuple[str, str, str]:
    """(served model, strategy, which kind of name) for a launch recipe, else a twin profile."""
    from tools.launch.recipe import RecipeError, load_recipe, recipe_names

    try:
        p = load_recipe(profile)
        return p.served_model_name, p.strategy.value, "launch"
    except RecipeError:
        pass
    from twin.profile import ProfileError, load_profile

    try:
        s = load_profile(profile)
        return s.served_model_name, s.strategy.value, "twin"
    except (ProfileError, OSError, ValueError):
        raise UsageError(
            f"unknown profile {profile!r}; launch recipes: {', '.join(recipe_names())} "
            "(twin profiles: `specroute sim --list`)"
        ) from None


def _parse_backends(specs: list[str]) -> list[Backend]:
    out: list[Backend] = []
    for item in (i.strip() for spec in specs for i in spec.split(",")):
        if not item:
            continue
        left, eq, url = item.partition("=")
        if not eq or not left or not url:
            raise UsageError(f"--from-profiles: expected NAME=URL, got {item!r}")
        name, colon, profile = left.partition(":")
        profile = profile if colon else name
        problem = url_problem(url)
        if problem:
            raise UsageError(f"--from-profiles: {left}: {problem}")
        model, strategy, source = _profile_facts(profile)
        out.append(Backend(name, profile, url.rstrip("/"), model, strategy, source))
    if not out:
        raise UsageError("--from-profiles: no backends given")
    return out


def _s(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def render_config(backends: list[Backend], *, listen: str, policy: str, otlp_endpoint: str | None = None) -> str:
    from policies import POLICY_NAMES

    lines = [
        "# specroute gateway config, written by `specroute config init`.",
        "# Reference: docs/configuration.md; check with `specroute config check FILE`.",
        "",
        "[gateway]",
        f"listen = {_s(listen)}",
        f"policy = {_s(policy)}              # {' | '.join(POLICY_NAMES)}",
    ]
    if otlp_endpoint:
        lines += ["", "[tracing]", 'exporter = "otlp"', f"endpoint = {_s(otlp_endpoint)}"]
    for b in backends:
        if b.source == "launch":
            how = [f"{b.name}: launched with `specroute backends show {b.profile}`"]
        elif b.source == "twin":
            how = [f"{b.name}: twin: `specroute sim --profile {b.profile}`"]
        else:
            how = []
        entry = ["[[backends]]", f"name = {_s(b.name)}", f"url = {_s(b.url)}", f"model = {_s(b.model)}"]
        entry.append(f"strategy = {_s(b.strategy)}")
        lines += [""] + [f"# {n}" for n in how + b.notes]
        if b.disabled is not None:
            lines.append(f"# NOT CONFIGURED: {b.disabled}")
            lines += [f"# {e}" for e in entry]
        else:
            lines += entry
    return "\n".join(lines) + "\n"


def _init(args: argparse.Namespace) -> int:
    try:
        parse_listen(args.listen, "--listen")
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if args.otlp_endpoint is not None:
        problem = url_problem(args.otlp_endpoint)
        if problem:
            raise UsageError(f"--otlp-endpoint: {problem}")
    if args.from_urls is not None:
        from tools.fit.onboard import backends_from_urls

        backends = backends_from_urls(
            [u.strip() for spec in args.from_urls for u in spec.split(",") if u.strip()],
            api_key=api_key_from_env(args.api_key_env),
        )
    else:
        if args.api_key_env is not None:
            raise UsageError("--api-key-env goes with --from-urls")
        backends = _parse_backends(args.from_profiles)
    text = render_config(backends, listen=args.listen, policy=args.policy, otlp_endpoint=args.otlp_endpoint)
    config_from_dict(tomllib.loads(text), args.output or "config")  # refuses what `serve` would refuse
    active = [b for b in backends if b.disabled is None]
    if not active:
        print(f"{PROG}: no server could be configured (each one's reason is in the file)", file=sys.stderr)
    if not args.output:
        sys.stdout.write(text)
        return 0 if active else 1
    path = Path(args.output)
    if path.exists() and not args.force:
        raise UsageError(f"{path} exists (pass --force to overwrite)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(
        f"wrote {path}: {len(active)} backend(s) for {', '.join(sorted({b.model for b in active})) or 'no model'}"
        + (f", {len(backends) - len(active)} commented out (see the file)" if len(active) < len(backends) else ""),
        file=sys.stderr,
    )
    return 0 if active else 1


def summary(config: Config) -> str:
    models: dict[str, list[str]] = {}
    for b in config.backends:
        models.setdefault(b.model, []).append(f"{b.name} ({b.strategy})")
    parts = [f"{m}: {', '.join(bs)}" for m, bs in models.items()] or ["no backends"]
    return f"listen {config.gateway.listen}, policy {config.gateway.policy}; " + "; ".join(parts)


def _check(args: argparse.Namespace) -> int:
    print(f"ok: {summary(load_config(args.file))}")
    return 0


def main(argv: list[str]) -> int:
    """Entry point of `specroute config`; returns the exit code."""
    try:
        args = _parser().parse_args(argv)
        return _init(args) if args.command == "init" else _check(args)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:
        print(f"{PROG}: config error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
