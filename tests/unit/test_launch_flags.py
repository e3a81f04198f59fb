"""Every flag the launch recipes emit, checked against SGLang 0.5.23's own argument definitions.

The wheel is downloaded once (`pip download --no-deps sglang==0.5.23`) into ~/.cache/specroute/wheels
(or $SPECROUTE_CACHE_DIR) and read with zipfile + ast: SGLang is never imported (it needs torch).
DDTree flags are not in the release; they are checked against tools/launch/ddtree_pr_flags.toml.
"""

from __future__ import annotations

import textwrap

import pytest

from tools.cli_backends import main as backends_main
from tools.launch import command, list_recipes, load_recipe
from tools.launch.sglang_args import (
    WheelUnavailable,
    check_algorithm_constraints,
    check_argv,
    check_build_constraints,
    ddtree_pr_extension,
    ensure_wheel,
    spec_for_build,
    spec_from_sources,
    spec_from_wheel,
)


@pytest.fixture(scope="module")
def wheel():
    try:
        return ensure_wheel()
    except WheelUnavailable as e:
        pytest.skip(f"PyPI unreachable, cannot check flags against SGLang's definitions: {e}")


@pytest.fixture(scope="module")
def release(wheel):
    return spec_from_wheel(wheel)


def test_definitions_read_from_the_wheel(release):
    assert release.version == "0.5.23"
    assert len(release.flags) > 300  # the whole parser, not a sample
    assert release.flags["--enable-metrics"].takes_value is False
    assert release.flags["--tp-size"].type == "int"
    assert release.flags["--tensor-parallel-size"].name == "--tensor-parallel-size"  # alias
    attn = release.flags["--attention-backend"].choices
    assert attn is not None and "trtllm_mla" in attn and "fa4" in attn and "cutlass_mla" not in attn
    algo = release.flags["--speculative-algorithm"].choices
    assert algo is not None and {"EAGLE3", "DFLASH", "NEXTN"} <= set(algo) and "DDTREE" not in algo
    assert "fa4" in (release.flags["--speculative-draft-attention-backend"].choices or ())
    assert "--speculative-ddtree-budget" not in release.flags


@pytest.mark.parametrize("name", [p.name for p in list_recipes()])
def test_recipe_flags_exist_in_sglang(release, name):
    prof = load_recipe(name)
    argv = command(prof)
    spec = spec_for_build(release, prof.build)
    assert check_argv(argv, spec) == []
    assert check_build_constraints(argv, prof.build) == []


def test_ddtree_recipes_need_the_pr_build(release):
    """Against the plain release the DDTree flags fail: the PR list is what lets them through."""
    for prof in list_recipes():
        problems = check_argv(command(prof), release)
        if prof.build == "ddtree-pr":
            assert any("--speculative-ddtree-budget: not an argument" in p for p in problems)
            assert any("--speculative-algorithm DDTREE" in p for p in problems)
        else:
            assert problems == []
    flags, algorithms, source = ddtree_pr_extension()
    assert "--speculative-ddtree-budget" in flags and algorithms == ["DDTREE"] and "#29907" in source


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--attention-backend", "cutlass_mla"], "not one of SGLang's choices"),  # removed in favour of trtllm_mla
        (["--tp", "8"], "not an argument"),  # abbreviation, not a flag
        (["--enable-metric"], "did you mean --enable-metrics"),  # typo
        (["--enable-metrics", "true"], "a switch, takes no value"),
        (["--max-running-requests", "many"], "expected an integer"),
        (["--speculative-algorithm", "MEDUSA"], "not one of SGLang's choices"),
        (["--speculative-draft-attention-backend", "trtllm_mla"], "not one of SGLang's choices"),
        (["--port"], "expects one value"),
        (["--tp-size", "8", "--tp-size", "4"], "given twice"),
        (["--speculative-ddtree-budget", "15"], "not an argument of SGLang 0.5.23"),
    ],
)
def test_checker_refuses_bad_flags_on_the_real_definitions(release, argv, expected):
    problems = check_argv(["python", "-m", "sglang.launch_server", *argv], release)
    assert any(expected in p for p in problems), problems


def test_checker_accepts_equals_form_and_aliases(release):
    assert check_argv(["--tensor-parallel-size=8", "--speculative-algorithm", "eagle3", "--model", "x"], release) == []


def test_ddtree_build_constraints():
    assert check_build_constraints(["--speculative-algorithm", "DDTREE", "--page-size", "1"], "ddtree-pr") == []
    problems = check_build_constraints(
        ["--attention-backend", "trtllm_mla", "--page-size", "64", "--speculative-use-rejection-sampling"], "ddtree-pr"
    )
    assert len(problems) == 3
    assert any("only page size 1" in p for p in problems)
    assert check_build_constraints(["--page-size", "64"], "release") == []


def test_algorithm_constraints_are_sglangs_startup_refusals():
    """`_handle_ngram` and `_handle_dflash` of SGLang 0.5.23's speculative hook, in its words."""
    ngram = ["--speculative-algorithm", "NGRAM", "--attention-backend", "trtllm_mla"]
    # the default breadth (10) becomes topk 10, refused on trtllm_mla's page size 64
    assert any("only supported for the 'flashinfer' backend" in p for p in check_algorithm_constraints(ngram))
    chain = [*ngram, "--speculative-ngram-max-bfs-breadth", "1"]
    assert check_algorithm_constraints(chain) == []
    assert check_algorithm_constraints(["--speculative-algorithm", "NGRAM", "--attention-backend", "flashinfer"]) == []
    assert check_algorithm_constraints([*chain, "--attn-dp-size", "8"]) == [
        "Currently ngram speculative decoding does not support dp attention."
    ]
    assert check_algorithm_constraints([*chain, "--dp-size", "8", "--enable-dp-attention"]) != []
    dflash = ["--speculative-algorithm", "DFLASH", "--speculative-dflash-block-size", "8"]
    assert any(
        "must be >= --speculative-num-draft-tokens" in p
        for p in check_algorithm_constraints([*dflash, "--speculative-draft-window-size", "4"])
    )
    assert check_algorithm_constraints([*dflash, "--attn-dp-size", "8"]) == [
        "DFLASH with dp attention requires --enable-dp-lm-head."
    ]
    assert check_algorithm_constraints([*dflash, "--attn-dp-size", "8", "--enable-dp-lm-head"]) == []
    assert check_algorithm_constraints(command(load_recipe("k26-ngram"))) == []


SYNTHETIC = {
    "sglang/srt/server_args.py": textwrap.dedent("""
        from sglang.srt.arg_groups.choices import BACKENDS
        from sglang.srt.arg_groups.fields.kernel import Kernel
        _INPUT_NAMESPACES = [Kernel]
        class ServerArgs:
            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--config", type=str)
                parser.add_argument("--legacy-switch", action=DeprecatedStoreTrueAction)
                parser.add_argument("--mode", type=str, choices=["a", "b"])
    """),
    "sglang/srt/arg_groups/choices.py": 'BACKENDS = ["triton", "fa4", "trtllm_mla"]\n',
    "sglang/srt/arg_groups/fields/kernel.py": textwrap.dedent("""
        class Kernel(msgspec.Struct):
            attention_backend: A[Optional[str], Arg(help="x", choices=BACKENDS)] = None
            tp_size: A[int, Arg(help="tp", aliases=["--tensor-parallel-size"])] = 1
            enable_thing: A[bool, "switch"] = False
            fused: A[bool, Arg(help="x", action=argparse.BooleanOptionalAction)] = True
            layout: A[Literal["nhd", "hnd"], "layout"] = "nhd"
            sizes: A[list[int], "sizes"] = []
            hidden: A[int, Arg(no_cli=True)] = 0
            plain: int = 0
    """),
}


def test_checker_on_synthetic_definitions():
    """The extractor itself, on a miniature of SGLang's layout: fields, Arg metadata, add_argument calls."""
    spec = spec_from_sources(SYNTHETIC, "9.9.9")
    assert {
        "--attention-backend",
        "--tp-size",
        "--tensor-parallel-size",
        "--enable-thing",
        "--fused",
        "--no-fused",
        "--layout",
        "--sizes",
        "--config",
        "--legacy-switch",
        "--mode",
    } <= set(spec.flags)
    assert "--hidden" not in spec.flags and "--plain" not in spec.flags
    assert (
        check_argv(
            [
                "--attention-backend",
                "fa4",
                "--tp-size",
                "2",
                "--enable-thing",
                "--no-fused",
                "--layout",
                "hnd",
                "--sizes",
                "1",
                "2",
                "--legacy-switch",
                "--mode",
                "b",
            ],
            spec,
        )
        == []
    )
    bad = check_argv(
        [
            "--attention-backend",
            "cutlass_mla",
            "--enable-thing",
            "yes",
            "--layout",
            "x",
            "--hidden",
            "1",
            "--mode",
            "c",
            "--sizes",
        ],
        spec,
    )
    assert len(bad) == 6, bad
    assert any("cutlass_mla: not one of SGLang's choices" in p for p in bad)
    assert any("--hidden: not an argument of SGLang 9.9.9" in p for p in bad)


def test_lint_command_fails_on_a_typo_recipe(tmp_path, wheel, capsys):
    typo = tmp_path / "typo.toml"
    typo.write_text(
        'name = "typo"\ndescription = "x"\nstrategy = "ar"\nserved_model_name = "m"\n'
        'model_path = "m"\ngpus = 8\n[[args]]\nflag = "--tp-size"\nvalue = 8\nwhy = "tp"\n'
        '[[args]]\nflag = "--attention-backend"\nvalue = "cutlass_mla"\nwhy = "old name"\n'
    )
    assert backends_main(["lint", str(typo), "--wheel", str(wheel)]) == 1
    out = capsys.readouterr().out
    assert "typo" in out and "FAIL" in out and "cutlass_mla" in out
    assert backends_main(["lint", "--wheel", str(wheel)]) == 0
    out = capsys.readouterr().out
    assert out.count(" ok ") == len(list_recipes())
