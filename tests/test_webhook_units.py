"""Pure units of the webhooks: the signature, the URL policy, the backoff, and the bound
on an event's data. No server, no network (a literal address or ``localhost`` only)."""

from __future__ import annotations

import json

import pytest

from api.errors import InvalidSpec
from service.eventlog import signing
from service.eventlog.deliverer import backoff_s
from service.eventlog.log import MAX_DATA_CHARS, bounded
from service.eventlog.url_policy import CODE, address_problem, check_url, resolve


def test_a_signature_verifies_and_anything_changed_does_not():
    body = b'{"version":1,"id":7}'
    value = signing.header("s3cret-s3cret-s3cret", body, timestamp=1_800_000_000)
    assert value.startswith("t=1800000000,v1=")
    assert signing.verify("s3cret-s3cret-s3cret", value, body, now=1_800_000_010)
    assert not signing.verify("s3cret-s3cret-s3cret", value, body + b" ", now=1_800_000_010)  # body changed
    assert not signing.verify("another-secret-here", value, body, now=1_800_000_010)  # wrong secret
    assert not signing.verify("s3cret-s3cret-s3cret", value, body, now=1_800_000_000 + 301)  # replayed too late
    forged = value.replace("t=1800000000", "t=1800000300")  # a fresh timestamp on an old signature
    assert not signing.verify("s3cret-s3cret-s3cret", forged, body, now=1_800_000_300)
    assert not signing.verify("s3cret-s3cret-s3cret", "garbage", body)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/hook",
        "http://localhost/hook",
        "http://api.localhost/hook",
        "http://127.1/hook",  # IPv4 short form
        "http://0x7f000001/hook",
        "http://[::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",  # IPv4-mapped
        "http://169.254.169.254/latest/meta-data",  # cloud metadata (link-local)
        "http://10.0.0.5/hook",
        "http://192.168.1.1/hook",
        "http://100.64.0.1/hook",  # shared address space
        "http://0.0.0.0/hook",
        "http://[fd00:ec2::254]/hook",
        "http://[2002:a9fe:a9fe::1]/hook",  # 6to4 of 169.254.169.254
        "http://[2001:0:4136:e378:8000:63bf:5601:5601]/hook",  # Teredo, its client 169.254.169.254
        "ftp://example.com/hook",
        "file:///etc/passwd",
        "http:///nohost",
        "http://user:pw@example.com/hook",
    ],
)
def test_the_url_policy_refuses_what_reaches_into_the_servers_network(url):
    with pytest.raises(InvalidSpec) as info:
        check_url(url, allow_private=False, where="notify.0.url")
    assert info.value.code == CODE and info.value.status == 422
    assert "notify.0.url" in info.value.message and "RAYDOCK_WEBHOOK_ALLOW_PRIVATE" in info.value.message


def test_the_url_policy_takes_public_targets_and_private_ones_when_allowed():
    assert check_url("https://hooks.example.com/x?y=1", allow_private=False) == ("https", "hooks.example.com", 443)
    assert check_url("http://93.184.215.14:8080/x", allow_private=False)[2] == 8080
    assert check_url("http://127.0.0.1:9/hook", allow_private=True) == ("http", "127.0.0.1", 9)
    with pytest.raises(InvalidSpec):
        check_url("gopher://127.0.0.1/", allow_private=True)  # the scheme is never allowed


def test_the_resolved_address_is_checked_at_send_time():
    address, problem = resolve("localhost", 80, allow_private=False)
    assert address is None and "loopback" in problem
    assert resolve("localhost", 80, allow_private=True)[0] in ("127.0.0.1", "::1")
    assert address_problem("8.8.8.8") is None
    assert "link-local" in address_problem("fe80::1%eth0")
    assert address_problem("2002:808:808::1") is None  # 6to4 of a public address


def test_backoff_doubles_up_to_its_cap():
    assert [backoff_s(n, 2.0, 30.0) for n in range(1, 7)] == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_an_events_data_stays_bounded():
    data = bounded({"reason": "x" * 100_000, "to": "FAILED", "path": "p" * 5000, "none": None, "n": 3})
    assert "none" not in data and data["to"] == "FAILED" and data["n"] == 3
    assert len(json.dumps(data)) <= MAX_DATA_CHARS
    many = bounded({f"k{i}": "v" * 900 for i in range(50)})
    assert many == {"truncated": True}
