"""One loadgen level run in-process against loadgen's own test server (`loadgen.testserver`)."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

from rich.console import Console

from loadgen.client import RequestOptions
from loadgen.datasets import load_dataset
from loadgen.driver import LevelSpec
from loadgen.runner import Plan, execute
from loadgen.summary import Summary
from loadgen.testserver import RunningServer, ServerConfig


def run_against_test_server(
    cfg: ServerConfig,
    dataset: str,
    spec: LevelSpec,
    tmp_path: Path | None = None,
    *,
    time_scale: float = 1.0,
    **opts: Any,
) -> tuple[Summary, RunningServer]:
    """`spec` on `dataset` against a test server of `cfg`, saved to `tmp_path` when given; the
    summary and the (stopped) server, whose `server` holds what it received. `opts` are
    RequestOptions fields (max_tokens 12 unless given). Every target must have run."""

    async def main() -> tuple[Summary, RunningServer]:
        async with RunningServer(cfg) as srv:
            plan = Plan(
                targets=[srv.url],
                gateway_url=srv.url,
                model=None,
                dataset=load_dataset(dataset),
                levels=[spec],
                opts=RequestOptions(**{"max_tokens": 12, **opts}),
                output=tmp_path,
                progress=False,
                time_scale=time_scale,
            )
            summary, errors = await execute(plan, Console(file=io.StringIO()))
            assert errors == []
            return summary, srv

    return asyncio.run(main())
