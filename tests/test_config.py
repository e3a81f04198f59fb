"""Config files: good ones load; bad ones name the key, exit non-zero, print no traceback."""

import subprocess

import pytest

from gateway.config import ConfigError, load_config
from policies import make_policy
from tests.support import specroute

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


def test_cli_bad_config_exits_nonzero_with_one_line_and_no_traceback(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[gateway]\npolicy = "fastest"\n')
    proc = subprocess.run(specroute("serve", "--config", str(path)), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "gateway.policy" in lines[0] and "fastest" in lines[0]


def test_cli_missing_config_file(tmp_path):
    proc = subprocess.run(
        specroute("serve", "--config", str(tmp_path / "nope.toml")), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "cannot read config file" in proc.stderr and "Traceback" not in proc.stderr


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
