"""Config files: good ones load; bad ones name the key (as `specroute serve` prints them:
tests/integration/test_config_cli.py)."""

import pytest

from backends import Strategy
from gateway.config import ConfigError, load_config
from policies import make_policy
from tools.cli_config import main as config_main

GOOD = """
[gateway]
listen = "127.0.0.1:9000"
policy = "round_robin"

[[backends]]
name = "k26-ar"
url = "http://gpu-a:30000/"
model = "kimi-k2.6"
strategy = "ar"

[[backends]]
name = "k26-dflash"
url = "http://gpu-b:30000"
model = "kimi-k2.6"
strategy = "dflash"
served_name = "Kimi-K2.6"

[models."kimi-k2.6"]
policy = "pinned"
pinned_backend = "k26-dflash"
"""


def test_good_config_loads(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(GOOD)
    config = load_config(path)
    specs = config.backend_specs()
    assert [s.name for s in specs] == ["k26-ar", "k26-dflash"]
    assert specs[0].url == "http://gpu-a:30000"  # trailing slash trimmed
    assert specs[1].strategy.speculative and specs[1].upstream_model == "Kimi-K2.6"
    assert config.policy_for("kimi-k2.6") == "pinned"


def test_an_ngram_backend_is_a_speculative_strategy(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(GOOD.replace('strategy = "ar"', 'strategy = "ngram"'))
    spec = load_config(path).backend_specs()[0]
    assert spec.strategy is Strategy.NGRAM and spec.strategy.speculative


BAD = [
    ("[gateway]\nlisten = 8000\n", "gateway.listen", "Expected `str`, got `int`"),
    ('[gateway]\nlisten = "nohost"\n', "gateway.listen", "HOST:PORT"),
    ('[gateway]\npolicy = "fastest"\n', "gateway.policy", "unknown policy 'fastest'"),
    ('[gateway]\nlisen = "x"\n', "gateway", "unknown key `lisen`"),
    ('[[backends]]\nname = "a"\nurl = "http://x"\n', "backends[0]", "missing required field `model`"),
    ('[[backends]]\nname = "a"\nurl = "ftp://x"\nmodel = "m"\n', "backends[0].url", "http://"),
    (
        '[[backends]]\nname = "a"\nurl = "http://x"\nmodel = "m"\nstrategy = "medusa"\n',
        "backends[0].strategy",
        "expected one of",
    ),
    (
        '[[backends]]\nname = "a"\nurl = "http://x"\nmodel = "m"\n[[backends]]\nname = "a"\nurl = "http://y"\n'
        'model = "m"\n',
        "backends[1].name",
        "duplicate",
    ),
    ('[models.other]\npolicy = "round_robin"\n', "models.other", "no backend serves"),
    ("this is = = not toml", "", "not valid TOML"),
    (
        '[[backends]]\nname = "a"\nurl = "http://x"\nmodel = "m"\n[models.m]\nslo_weight = -1.0\n',
        "models.m",
        "slo_weight must be in [0, 100]",
    ),
]


@pytest.mark.parametrize("text,key,expected", BAD)
def test_bad_config_names_the_key(tmp_path, text, key, expected):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert key in str(info.value) and expected in str(info.value)


def test_goodput_slo_options_reach_the_policy(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        '[[backends]]\nname = "a"\nurl = "http://x"\nmodel = "m"\n'
        '[models.m]\npolicy = "goodput"\nttft_slo_s = 10.0\nslo_weight = 3.0\n'
    )
    config = load_config(path)
    options = config.policy_options("m", "goodput")
    assert options["ttft_slo_s"] == 10.0 and options["slo_weight"] == 3.0
    described = make_policy("goodput", **options).describe()["policy"]
    assert described["ttft_slo_s"] == 10.0 and described["slo_weight"] == 3.0


ONE_BACKEND = '[[backends]]\nname = "a"\nurl = "http://x"\nmodel = "m"\n'

# Each passed before: a value out of range, nan or inf, refused by key name with what was expected.
OUT_OF_RANGE = [
    ('[gateway]\nlisten = "127.0.0.1:99999"\n', "gateway.listen", "port in 1..65535"),
    ('[gateway]\nlisten = "127.0.0.1:0"\n', "gateway.listen", "port in 1..65535"),
    ("[gateway]\nshutdown_grace_s = nan\n", "gateway.shutdown_grace_s", "finite"),
    ("[gateway]\nshutdown_grace_s = inf\n", "gateway.shutdown_grace_s", "finite"),
    ("[gateway]\nshutdown_grace_s = -1\n", "gateway.shutdown_grace_s", ">= 0"),
    ("[health]\ninterval_s = nan\n", "health.interval_s", "finite"),
    ("[health]\nengine_check_s = nan\n", "health.engine_check_s", "finite"),
    ("[health]\nmodels_refresh_s = inf\n", "health.models_refresh_s", "finite"),
    ("[timeouts]\nconnect_s = nan\n", "timeouts.connect_s", "finite"),
    ("[timeouts]\nconnect_s = inf\n", "timeouts.connect_s", "finite"),
    ("[timeouts]\nfirst_byte_s = -inf\n", "timeouts.first_byte_s", "finite"),
    ("[retry]\nbackoff_initial_s = -1\n", "retry.backoff_initial_s", ">= 0"),
    ("[retry]\nbackoff_max_s = nan\n", "retry.backoff_max_s", "finite"),
    ("[retry]\ndeadline_s = -5\n", "retry.deadline_s", "> 0"),
    ("[admission]\nqueue_timeout_s = -1\n", "admission.queue_timeout_s", ">= 0"),
    ("[admission]\nqueue_timeout_s = nan\n", "admission.queue_timeout_s", "finite"),
    ("[health]\ncircuit_cooldown_s = -1\n", "health.circuit_cooldown_s", ">= 0"),
    ("[auth]\nrate_limit_burst = -1\n", "auth.rate_limit_burst", ">= 0"),
    ("[auth]\nrate_limit_rps = nan\n", "auth.rate_limit_rps", "finite"),
    ("[tracing]\nsample_ratio = 5.0\n", "tracing.sample_ratio", "in [0, 1]"),
    ("[tracing]\nsample_ratio = nan\n", "tracing.sample_ratio", "finite"),
    ('[logging]\nlevel = "LOUD"\n', "logging.level", "'DEBUG', 'INFO', 'WARNING', 'ERROR', 'CRITICAL'"),
    (ONE_BACKEND + "[models.m]\nhysteresis = nan\n", "models.m.hysteresis", "finite"),
]


@pytest.mark.parametrize("text,key,expected", OUT_OF_RANGE)
def test_out_of_range_nan_and_inf_values_are_refused_by_key(tmp_path, text, key, expected):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: {key}: ") and expected in str(info.value), str(info.value)


BAD_BACKENDS = [
    ('url = "http://host:notaport"\nmodel = "m"\n', "backends[0].url", "port in 1..65535"),
    ('url = "http://host:70000"\nmodel = "m"\n', "backends[0].url", "port in 1..65535"),
    ('url = "http://host:0"\nmodel = "m"\n', "backends[0].url", "port in 1..65535"),
    ('url = "http://"\nmodel = "m"\n', "backends[0].url", "expected a host"),
    ('url = "https://:30000"\nmodel = "m"\n', "backends[0].url", "expected a host"),
    ('url = "http://host:1/?x=1"\nmodel = "m"\n', "backends[0].url", "query"),
    ('url = "http://x"\nmodel = ""\n', "backends[0].model", "non-empty"),
]


@pytest.mark.parametrize("entry,key,expected", BAD_BACKENDS)
def test_bad_backend_urls_and_empty_model_are_refused(tmp_path, entry, key, expected):
    path = tmp_path / "bad.toml"
    path.write_text('[[backends]]\nname = "a"\n' + entry)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: {key}: ") and expected in str(info.value), str(info.value)


def test_good_backend_urls_and_edge_values_still_load(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        '[gateway]\nlisten = "[::1]:65535"\nshutdown_grace_s = 0\n'
        "[retry]\nbackoff_initial_s = 0\n[health]\nengine_check_s = 0\ncircuit_cooldown_s = 0\n"
        '[admission]\nmax_queue = 0\n[tracing]\nsample_ratio = 1\n[logging]\nlevel = "info"\n'
        '[[backends]]\nname = "a"\nurl = "http://[::1]:30000"\nmodel = "m"\n'
        '[[backends]]\nname = "b"\nurl = "https://gpu-gw/k26-ar/"\nmodel = "m"\n'
    )
    config = load_config(path)
    assert [s.url for s in config.backend_specs()] == ["http://[::1]:30000", "https://gpu-gw/k26-ar"]


def test_config_check_refuses_a_nan_grace_with_one_line(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text("[gateway]\nshutdown_grace_s = nan\n")
    assert config_main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"specroute config: config error: {path}: gateway.shutdown_grace_s: expected a finite number >= 0, got nan"
    )


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--from-profiles", "k26-ar=http://host:bad"], "--from-profiles: k26-ar: expected a port in 1..65535"),
        (["--from-profiles", "k26-ar=http://host:70000"], "--from-profiles: k26-ar: expected a port in 1..65535"),
        (["--from-profiles", "k26-ar=http://"], "--from-profiles: k26-ar: expected a host"),
        (["--from-profiles", "k26-ar=http://a:1", "--otlp-endpoint", "notaurl"], "--otlp-endpoint: expected an http"),
        (
            ["--from-profiles", "k26-ar=http://a:1", "--otlp-endpoint", "http://:4318"],
            "--otlp-endpoint: expected a host",
        ),
        (["--from-profiles", "k26-ar=http://a:1", "--listen", "0.0.0.0:99999"], "--listen: expected a port"),
    ],
)
def test_config_init_refuses_what_serve_could_not_start(tmp_path, capsys, argv, expected):
    out = tmp_path / "c.toml"
    assert config_main(["init", *argv, "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err
    assert not out.exists()


def test_goodput_ttft_weight_per_model_reaches_the_policy(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(ONE_BACKEND + '[models.m]\npolicy = "goodput"\nttft_weight = 2.5\nexternality = 0.5\n')
    options = load_config(path).policy_options("m", "goodput")
    assert options["ttft_weight"] == 2.5 and options["externality"] == 0.5
    assert make_policy("goodput", **options).ttft_weight == 2.5  # type: ignore[attr-defined]
    path.write_text(ONE_BACKEND + "[models.m]\nttft_weight = 0\n")
    with pytest.raises(ConfigError, match=r"models\.m: policy 'goodput': ttft_weight must be in \(0, 10\]"):
        load_config(path)


def test_unknown_key_in_a_model_section_names_the_model(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(
        '[[backends]]\nname = "a"\nurl = "http://x"\nmodel = "kimi-k2.6"\n[models."kimi-k2.6"]\nttft_wieght = 2.0\n'
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f'{path}: models."kimi-k2.6": unknown key `ttft_wieght`'
    path.write_text(ONE_BACKEND + '[models.m]\nthreshold = "x"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: models.m.threshold: Expected `int | null`")


def test_an_option_the_models_policy_does_not_take_is_refused(tmp_path):
    path = tmp_path / "c.toml"
    for section, expected in [
        ('policy = "goodput"\nthreshold = 5\n', "models.m: threshold: not an option of policy goodput (its options: "),
        ("threshold = 5\n", "models.m: threshold: not an option of policy goodput"),  # gateway.policy's
        ('policy = "round_robin"\nseed = 1\n', "models.m: seed: not an option of policy round_robin (it takes none)"),
        ('policy = "threshold"\nepsilon = 0.1\n', "models.m: epsilon: not an option of policy threshold"),
    ]:
        path.write_text(ONE_BACKEND + "[models.m]\n" + section)
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert str(info.value).startswith(f"{path}: {expected}"), str(info.value)
    # With the policy header on, a threshold for the requests that choose `threshold` is kept for that policy.
    path.write_text(
        "[gateway]\nallow_policy_header = true\n" + ONE_BACKEND + '[models.m]\npolicy = "goodput"\nthreshold = 5\n'
    )
    config = load_config(path)
    assert config.policy_options("m", "threshold") == {"threshold": 5}
    assert "threshold" not in config.policy_options("m", "goodput")
    path.write_text(
        "[gateway]\nallow_policy_header = true\n"
        + ONE_BACKEND
        + '[models.m]\npolicy = "goodput"\npinned_backend = "a"\n'
    )
    with pytest.raises(ConfigError, match="pinned_backend: not an option of policy goodput"):
        load_config(path)  # pinned is never chosen by header
