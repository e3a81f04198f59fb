"""gateway/discovery.py's pure parts: a member's URL from its entry's, and the config's checks of
discovery (the resolver itself: tests/integration/test_discovery_resolver.py)."""

from __future__ import annotations

import pytest

from gateway.config import BackendEntry, ConfigError, config_from_dict
from gateway.discovery import member_entry


def test_member_urls_keep_the_entry_s_port_path_and_credentials():
    entry = BackendEntry(name="e", url="http://user:pw@svc.ns:8080/prefix", model="m", discover="dns")
    assert member_entry(entry, "10.0.0.1").url == "http://user:pw@10.0.0.1:8080/prefix"
    assert member_entry(BackendEntry(name="e", url="http://svc", model="m"), "fd00::1").url == "http://[fd00::1]"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"backends": [{"name": "a~b", "url": "http://x:1", "model": "m"}]}, "without '@', '/' or '~'"),
        ({"backends": [{"name": "a", "url": "https://x:1", "model": "m", "discover": "dns"}]}, "use an http:// URL"),
        ({"backends": [{"name": "a", "url": "http://x:1", "model": "m", "discover": "srv"}]}, "backends[0].discover"),
        ({"discovery": {"nameservers": ["dns.example:53"]}}, "discovery.nameservers: expected an IP address"),
        ({"discovery": {"nameservers": ["127.0.0.1:99999"]}}, "discovery.nameservers"),
        ({"discovery": {"resolve_s": 0}}, "discovery.resolve_s: expected a value > 0"),
        (
            {
                "backends": [{"name": "a", "url": "http://x:1", "model": "m", "discover": "dns"}],
                "models": {"m": {"policy": "pinned", "pinned_backend": "a"}},
            },
            "whose members come and go",
        ),
    ],
)
def test_discovery_config_is_checked(change, message):
    data = {"backends": [{"name": "a", "url": "http://x:1", "model": "m"}], **change}
    with pytest.raises(ConfigError, match=None) as raised:
        config_from_dict(data)
    assert message in str(raised.value)


def test_nameservers_take_ports_and_ipv6():
    config = config_from_dict(
        {
            "discovery": {"nameservers": ["10.96.0.10", "127.0.0.1:5353", "[fd00::a]:53", "fd00::b"]},
            "backends": [{"name": "a", "url": "http://x:1", "model": "m", "discover": "dns"}],
        }
    )
    assert config.backends[0].discover == "dns"
