"""Launch recipes of the studies' SGLang servers: data, rendering, `specroute backends` show/systemd/launch."""

from __future__ import annotations

import shlex
import sys

import pytest

from tools.cli_backends import main as backends_main
from tools.launch import LaunchOptions, RecipeError, command, environment, explained, list_recipes, load_recipe
from tools.launch.recipe import recipe_names, rendered_args, shell_line
from tools.launch.run import LaunchError, launch, preflight
from tools.launch.systemd import unit
from twin.profile import load_profile as load_twin

SEED = {"k26-ar", "k26-eagle3", "k26-dflash", "k26-ddtree", "k26-ngram", "qwen36-ddtree-b15", "qwen36-ar"}


def _flag_values(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, tok in enumerate(argv):
        if tok.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[tok] = nxt if nxt is not None and not nxt.startswith("--") else None
    return out


def test_every_seed_system_has_a_recipe_and_every_argument_a_reason():
    assert set(recipe_names()) >= SEED
    for prof in list_recipes():
        rendered = rendered_args(prof)
        assert rendered, prof.name
        for arg, tokens in rendered:
            assert arg.why.strip() and len(arg.why.splitlines()) == 1, (prof.name, arg.flag)
            assert tokens[0] == arg.flag
        flags = _flag_values(command(prof))
        # Observability and naming on every server, as the gateway and the compose stack expect.
        for needed in (
            "--enable-metrics",
            "--enable-trace",
            "--otlp-traces-endpoint",
            "--served-model-name",
            "--tp-size",
            "--host",
            "--port",
            "--model-path",
        ):
            assert needed in flags, (prof.name, needed)
        assert flags["--tp-size"] == str(prof.gpus)
        assert flags["--served-model-name"] == prof.served_model_name


def test_study_facts_are_in_the_commands():
    ar = _flag_values(command(load_recipe("k26-ar")))
    assert ar["--tp-size"] == "8" and ar["--attention-backend"] == "trtllm_mla"
    eagle = _flag_values(command(load_recipe("k26-eagle3")))
    assert eagle["--speculative-algorithm"] == "EAGLE3"
    assert eagle["--speculative-draft-model-path"] == "lightseekorg/kimi-k2.6-eagle3"
    assert (
        eagle["--speculative-num-steps"],
        eagle["--speculative-eagle-topk"],
        eagle["--speculative-num-draft-tokens"],
    ) == ("3", "1", "4")
    dflash = _flag_values(command(load_recipe("k26-dflash")))
    assert dflash["--speculative-algorithm"] == "DFLASH"
    assert dflash["--speculative-draft-model-path"] == "z-lab/Kimi-K2.6-DFlash"
    assert dflash["--speculative-dflash-block-size"] == "8"
    assert dflash["--speculative-draft-window-size"] == "4096"
    assert dflash["--speculative-draft-attention-backend"] == "fa4"
    qwen = _flag_values(command(load_recipe("qwen36-ddtree-b15")))
    assert qwen["--tp-size"] == "1" and qwen["--speculative-ddtree-budget"] == "15"
    assert qwen["--speculative-algorithm"] == "DDTREE"
    assert "--speculative-algorithm" not in _flag_values(command(load_recipe("qwen36-ar")))
    ngram = _flag_values(command(load_recipe("k26-ngram")))
    assert ngram["--speculative-algorithm"] == "NGRAM" and "--speculative-draft-model-path" not in ngram
    assert ngram["--speculative-ngram-max-bfs-breadth"] == "1" and ngram["--speculative-num-draft-tokens"] == "12"


def test_the_ddtree_recipe_says_it_needs_a_pull_request_build_and_no_mla_tree_verify_exists():
    prof = load_recipe("k26-ddtree")
    assert prof.build == "ddtree-pr" and prof.notes is not None
    assert "pull request #29907" in prof.notes and "MLA is not upstream" in prof.notes
    script = explained(prof)
    assert "# needs an SGLang build with DDTree support (not in a release)" in script
    assert "# note: needs an SGLang build of pull request #29907" in script


def test_launch_recipes_agree_with_the_twin_profiles_of_the_same_name():
    """The twin imitates what the launch recipe starts: same served name, strategy, TP and drafter."""
    for prof in list_recipes():
        twin = load_twin(prof.name)
        flags = _flag_values(command(prof))
        assert (twin.served_model_name, twin.strategy, twin.tp_size) == (
            prof.served_model_name,
            prof.strategy,
            prof.gpus,
        ), prof.name
        spec = twin.speculative
        assert (spec.algorithm if spec else None) == flags.get("--speculative-algorithm"), prof.name
        if spec is not None and spec.algorithm == "NGRAM":
            assert flags["--speculative-num-draft-tokens"] == str(spec.num_draft_tokens), prof.name
            assert flags["--speculative-ngram-max-bfs-breadth"] == str(spec.eagle_topk), prof.name
            assert twin.ngram is not None
            assert flags["--speculative-ngram-capacity"] == str(twin.ngram.trie_capacity), prof.name
            assert flags["--speculative-ngram-max-trie-depth"] == str(twin.ngram.max_trie_depth), prof.name
        elif spec is not None:
            assert spec.draft_model_path == flags["--speculative-draft-model-path"], prof.name
            if spec.ddtree_budget is not None:
                assert str(spec.ddtree_budget) == flags["--speculative-ddtree-budget"], prof.name
            elif spec.dflash_block_size is not None:
                assert str(spec.dflash_block_size) == flags["--speculative-dflash-block-size"], prof.name


def test_options_fill_the_command():
    prof = load_recipe("k26-ddtree")
    opts = LaunchOptions(
        model_path="/models/k26", port=31000, gpus=tuple(range(8)), otlp_endpoint="jaeger:4317", ddtree_budget=64
    )
    flags = _flag_values(command(prof, opts))
    assert flags["--model-path"] == "/models/k26" and flags["--port"] == "31000"
    assert flags["--speculative-ddtree-budget"] == "64" and flags["--otlp-traces-endpoint"] == "jaeger:4317"
    assert environment(prof, opts) == {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    no_trace = _flag_values(command(prof, LaunchOptions(trace=False)))
    assert "--enable-trace" not in no_trace and "--otlp-traces-endpoint" not in no_trace
    assert "--enable-metrics" in no_trace
    with pytest.raises(RecipeError, match="needs 8 GPU"):
        environment(prof, LaunchOptions(gpus=(0, 1)))
    with pytest.raises(RecipeError, match="DDTree recipes only"):
        command(load_recipe("k26-ar"), LaunchOptions(ddtree_budget=4))


def test_recipe_without_reason_is_refused(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'name = "bad"\ndescription = "x"\nstrategy = "ar"\nserved_model_name = "m"\n'
        'model_path = "m"\ngpus = 1\n[[args]]\nflag = "--tp-size"\nvalue = 1\nwhy = " "\n'
    )
    with pytest.raises(RecipeError, match="reason"):
        load_recipe(str(bad))
    assert backends_main(["show", str(bad)]) == 2


def test_show_prints_the_exact_line(capsys):
    assert backends_main(["show", "k26-dflash", "--gpus", "0,1,2,3,4,5,6,7", "--port", "30001"]) == 0
    line = capsys.readouterr().out.strip()
    prof = load_recipe("k26-dflash")
    opts = LaunchOptions(gpus=tuple(range(8)), port=30001)
    assert line == shell_line(prof, opts)
    tokens = shlex.split(line)
    assert tokens[0] == "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"
    assert tokens[1:4] == ["python", "-m", "sglang.launch_server"]
    assert tokens[1:] == command(prof, opts)


def test_systemd_unit_runs_the_recipe_command(capsys):
    assert (
        backends_main(
            [
                "systemd",
                "k26-eagle3",
                "--python",
                "/opt/sglang/bin/python",
                "--gpus",
                "0,1,2,3,4,5,6,7",
                "--user",
                "gpu",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "[Unit]" in text and "[Service]" in text and "WantedBy=multi-user.target" in text
    assert "User=gpu" in text and 'Environment="CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"' in text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
    exec_lines = [lines[start].removeprefix("ExecStart=")]
    while exec_lines[-1].endswith("\\"):
        exec_lines[-1] = exec_lines[-1][:-1]
        start += 1
        exec_lines.append(lines[start])
    argv = shlex.split(" ".join(exec_lines))
    prof = load_recipe("k26-eagle3")
    assert argv == command(prof, LaunchOptions(python="/opt/sglang/bin/python"))
    assert "%" not in unit(prof).replace("%%", "")


def test_launch_without_sglang_is_one_clear_line(capsys):
    # This venv has no SGLang (the [sglang] extra needs torch and a GPU host).
    code = backends_main(["launch", "qwen36-ar"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert len(err.splitlines()) == 1 and "SGLang is not installed" in err and "[sglang]" in err


def test_launch_preflight_and_exec_with_fakes():
    prof = load_recipe("k26-ar")
    found = lambda name: object()  # noqa: E731 - "sglang" and "opentelemetry" both importable
    with pytest.raises(LaunchError, match="no NVIDIA GPU"):
        preflight(prof, LaunchOptions(), find_spec=found, gpus=lambda: [])
    with pytest.raises(LaunchError, match="this host has 4"):
        preflight(prof, LaunchOptions(), find_spec=found, gpus=lambda: [0, 1, 2, 3])
    calls = []
    launch(
        prof,
        LaunchOptions(gpus=(7, 6, 5, 4, 3, 2, 1, 0), port=30123),
        find_spec=found,
        gpus=lambda: list(range(8)),
        execve=lambda path, argv, env: calls.append((path, argv, env)),
    )
    ((path, argv, env),) = calls
    assert path == sys.executable and argv[0] == sys.executable and argv[1:3] == ["-m", "sglang.launch_server"]
    assert env["CUDA_VISIBLE_DEVICES"] == "7,6,5,4,3,2,1,0"
    assert argv[1:] == command(prof, LaunchOptions(port=30123))[1:]

    def no_otel(name: str) -> object | None:
        return None if name == "opentelemetry" else object()

    warnings = preflight(load_recipe("qwen36-ddtree-b15"), LaunchOptions(), find_spec=no_otel, gpus=lambda: [0])
    assert any("--no-trace" in w for w in warnings) and any("DDTree" in w for w in warnings)


def test_cli_usage_errors_exit_2(capsys):
    assert backends_main(["show", "no-such-recipe"]) == 2
    assert backends_main(["show", "k26-ar", "--gpus", "a,b"]) == 2
    assert backends_main(["show", "k26-ar", "--ddtree-budget", "8"]) == 2
    assert backends_main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown launch recipe 'no-such-recipe'" in err and "Traceback" not in err
    assert backends_main(["list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in SEED)
