"""Local mode against a real server (real HTTP, SQLite, no Ray): once a user other than
``admin`` has held a token, a request without one is refused for good, whatever users are
deleted and however often the server restarts; and nobody may take the server admin's name."""

from __future__ import annotations

import pytest

from bench.harness.identity_attacks import local_mode_after_users_left, start_local, take_the_admin_name

pytestmark = pytest.mark.slow  # starts a server (no Ray)


def test_local_mode_once_left_stays_left_after_the_users_go_and_a_restart(tmp_path):
    local = start_local(tmp_path / "data")
    try:
        assert local_mode_after_users_left(local) == [200, 401, 401]
        with local.http(local.admin_token) as admin:
            assert [u["name"] for u in admin.get("/v1/users").json()] == ["admin"]  # nobody else is left
        local.server.stop()
        local.server.start()
        assert local.tokenless_status() == 401
        with local.http(local.admin_token) as admin:
            assert admin.get("/v1/me").json()["name"] == "admin"  # the admin's own token still works
    finally:
        local.server.stop()


def test_the_server_admins_name_cannot_be_taken_once_its_user_is_deleted(tmp_path):
    local = start_local(tmp_path / "data")
    try:
        taken = take_the_admin_name(local)
        assert taken.status_code == 422 and taken.json()["error"]["code"] == "user_name_reserved"
        assert "admin" in taken.json()["error"]["message"]
    finally:
        local.server.stop()
