"""The two-hosts helper's own rules: where it cannot make namespaces it gives a reason (the two-node tests skip
with it) instead of failing; names stay within Linux's 15 characters."""
import pytest

import two_hosts


def test_not_root_is_a_reason_to_skip(monkeypatch):
    monkeypatch.setattr(two_hosts.os, "geteuid", lambda: 1000)
    assert two_hosts.unavailable_reason() == "creating network namespaces needs root"


def test_missing_ip_command_is_a_reason_to_skip(monkeypatch):
    monkeypatch.setattr(two_hosts.os, "geteuid", lambda: 0)
    monkeypatch.setattr(two_hosts.shutil, "which", lambda name: None)
    assert "iproute2" in two_hosts.unavailable_reason()


def test_names_fit_linux_interface_names():
    made = two_hosts.TwoHosts(tag="abc")
    assert all(len(name) <= 15 for name in (*made.namespaces, *made._links))  # pylint: disable=protected-access
    with pytest.raises(ValueError, match=r"For 'TwoHosts', 'tag' must have at most 3 characters, but got 'abcd'"):
        two_hosts.TwoHosts(tag="abcd")
