"""Keys, tenants and the spend record through the real app in this process (issue 25): the
secret is shown once and only its hash is stored; settings never show a token; a key's
scope, budget and revocation; an engine failure refunds the key and marks its spend row;
a 422 names an exemplar by index and field and never quotes it; a database created at
revision 0002 keeps its contexts, ledgers and static keys after the upgrade."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command

from dpicl.config import Settings
from dpicl.serving.contexts import calibrate_mechanism
from dpicl.spec import ContextSpec
from dpicl.store.keys import static_key_id
from dpicl.store.migrations import _config, head
from dpicl.store.repository import make_engine
from tests.conftest import ADMIN, USER, admin_headers, user_headers
from tests.server.api_helpers import make_client, voting_context
from tests.server.hostile_cases import SECRET
from tests.server.test_failures import FailsOnQuery, _one_answer_context
from tests.server.test_keys_processes import bearer, budget_for


def _ask(c: Any, cid: str, headers: dict[str, str], query: str = "q") -> Any:
    return c.post("/v1/classify", json={"context_id": cid, "query": query}, headers=headers)


def test_settings_never_show_a_token() -> None:
    s = Settings(
        admin_token="admin-secret-1",
        api_keys="static-secret-2,static-secret-3",
        database_url="postgresql+psycopg://dpicl:db-password-4@db/dpicl",
        cache_salt_secret="salt-secret-5" * 2,
    )
    shown = repr(s) + str(s)
    for secret in ("admin-secret-1", "static-secret-2", "static-secret-3", "db-password-4"):
        assert secret not in shown
    assert "salt-secret-5" not in shown + str(s.model_dump())
    assert "admin-secret-1" not in str(s.model_dump())
    assert [k.get_secret_value() for k in s.api_keys] == ["static-secret-2", "static-secret-3"]


def test_a_key_is_shown_once_and_stored_as_its_hash(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        r = c.post("/v1/keys", json={"name": "k", "tenant": "acme"}, headers=admin_headers())
        assert r.status_code == 201, r.text
        created = r.json()
        secret = created["secret"]
        listed = c.get("/v1/keys", headers=admin_headers()).json()["data"]
        assert [k["id"] for k in listed] == [created["id"]]
        # Pages, in id order.
        more = [
            c.post("/v1/keys", json={"tenant": "acme"}, headers=admin_headers()).json()["id"]
            for _ in range(2)
        ]
        ids, after = [], None
        while True:
            params = {"limit": 2} | ({"after": after} if after else {})
            page = c.get("/v1/keys", params=params, headers=admin_headers()).json()
            ids += [k["id"] for k in page["data"]]
            if page["next"] is None:
                break
            after = page["next"]
        assert ids == sorted([created["id"], *more])
        assert secret not in str(listed) and "secret" not in listed[0]
        # Keys are the admin's to manage.
        assert c.get("/v1/keys", headers=user_headers()).status_code == 401
        assert c.get("/v1/keys", headers=bearer(secret)).status_code == 401
    eng = sa.create_engine(f"sqlite:///{tmp_path / 'dpicl.db'}")
    with eng.connect() as conn:
        rows = conn.execute(sa.text("SELECT * FROM dpicl_keys")).mappings().all()
    eng.dispose()
    assert len(rows) == 3
    assert secret not in str([dict(r) for r in rows])
    mine = next(r for r in rows if r["id"] == created["id"])
    assert mine["secret_hash"] == hashlib.sha256(secret.encode()).hexdigest()


def test_key_specs_are_checked(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        for body, param in [
            ({}, "contexts"),
            ({"tenant": "a", "contexts": ["ctx_" + "0" * 24]}, "tenant"),
            ({"contexts": ["nope"]}, "contexts.0"),
            ({"tenant": "bad tenant"}, "tenant"),
            ({"tenant": "a", "rate_limit": 0}, "rate_limit"),
            ({"tenant": "a", "budget": {"epsilon": -1, "delta": 1e-5}}, "budget.epsilon"),
        ]:
            r = c.post("/v1/keys", json=body, headers=admin_headers())
            assert r.status_code == 422, (body, r.text)
            assert r.json()["error"]["param"] == param, (body, r.json())
        assert c.delete("/v1/keys/key_nope", headers=admin_headers()).status_code == 404


def test_scope_budget_revocation_and_spend_in_process(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        mine = c.post(
            "/v1/contexts", json=voting_context(tenant="acme"), headers=admin_headers()
        ).json()["id"]
        other = c.post("/v1/contexts", json=voting_context(), headers=admin_headers()).json()["id"]
        key = c.post(
            "/v1/keys",
            json={"tenant": "acme", "budget": budget_for(2)},
            headers=admin_headers(),
        ).json()
        h = bearer(key["secret"])
        assert _ask(c, mine, h).status_code == 200
        assert _ask(c, other, h).status_code == 404
        # The admin routes stay the admin's, whatever a key's scope.
        assert c.get(f"/v1/contexts/{mine}", headers=h).status_code == 401
        assert c.get(f"/v1/contexts/{mine}/spend", headers=h).status_code == 401
        assert _ask(c, mine, h).status_code == 200
        r = _ask(c, mine, h)
        assert r.status_code == 402 and "own privacy budget" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "authorization"  # the key's, not the context's
        assert _ask(c, mine, user_headers()).status_code == 200  # the context still answers
        spend = c.get(f"/v1/contexts/{mine}/spend", headers=admin_headers()).json()
        totals = {t["key_id"]: t for t in spend["by_key"]}
        assert totals[key["id"]]["answered"] == 2 and totals[key["id"]]["refused"] == 1
        assert totals[static_key_id(USER)]["answered"] == 1
        assert [r["outcome"] for r in spend["recent"]] == [
            "answered",
            "refused",
            "answered",
            "answered",
        ]
        assert spend["queries"] == 3
        assert _ask(c, mine, user_headers(), f"{SECRET} query").status_code == 200
        assert c.delete(f"/v1/keys/{key['id']}", headers=admin_headers()).status_code == 204
        assert _ask(c, mine, h).status_code == 401
        assert c.delete(f"/v1/keys/{key['id']}", headers=admin_headers()).status_code == 404
    # The spend record holds who, what and how much, never a query's text.
    eng = sa.create_engine(f"sqlite:///{tmp_path / 'dpicl.db'}")
    with eng.connect() as conn:
        rows = conn.execute(sa.text("SELECT * FROM dpicl_spend")).mappings().all()
    eng.dispose()
    assert len(rows) == 5  # the key: 2 answers, 1 refusal; the static key: 2 answers
    columns = {"id", "at", "key_id", "context_id", "epsilon", "delta", "mu2", "outcome"}
    assert set(rows[0]) == columns
    assert SECRET not in str([dict(r) for r in rows])


def test_an_engine_failure_refunds_the_key_and_marks_its_spend_row(tmp_path: Path) -> None:
    with make_client(tmp_path, engine=FailsOnQuery(delay=0.0)) as c:
        cid = c.post("/v1/contexts", json=_one_answer_context(), headers=admin_headers()).json()[
            "id"
        ]
        key = c.post(
            "/v1/keys",
            # Exactly one answer of the context's analytic calibration, as the context's.
            json={"contexts": [cid], "budget": {"epsilon": 1.0, "delta": 1e-5}},
            headers=admin_headers(),
        ).json()
        h = bearer(key["secret"])
        assert _ask(c, cid, h, "FAIL now").status_code == 503
        r = _ask(c, cid, h)
        assert r.status_code == 200, r.text  # both budgets were refunded
        spend = c.get(f"/v1/contexts/{cid}/spend", headers=admin_headers()).json()
        assert [r["outcome"] for r in spend["recent"]] == ["answered", "refunded"]
        listed = c.get("/v1/keys", headers=admin_headers()).json()["data"]
        assert listed[0]["spent"]["queries"] == 1


def test_a_bad_exemplar_is_named_never_quoted(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        for mutate, param in [
            (lambda e: e.update(input=SECRET + "\x00"), "exemplars.2.input"),
            (lambda e: e.update(input=SECRET + "x" * 20_001), "exemplars.2.input"),
            (lambda e: e.update(extra=SECRET), "exemplars.2.extra"),
            (lambda e: e.update(output=SECRET), "exemplars.2.output"),
            (lambda e: e.update(output=12345), "exemplars.2.output"),
        ]:
            body = voting_context()
            mutate(body["exemplars"][2])
            r = c.post("/v1/contexts", json=body, headers=admin_headers())
            assert r.status_code == 422, r.text
            err = r.json()["error"]
            assert err["param"] == param, err
            assert param in err["message"], err
            assert SECRET not in r.text and "12345" not in r.text, r.text
        # A body that is not an object would be quoted whole: it is not.
        r = c.post("/v1/contexts", json=[{"input": SECRET}], headers=admin_headers())
        assert r.status_code == 422 and SECRET not in r.text, r.text


def test_a_database_at_0002_keeps_its_contexts_ledgers_and_static_keys(tmp_path: Path) -> None:
    db = tmp_path / "dpicl.db"
    eng = make_engine(f"sqlite:///{db}")
    with eng.connect() as conn:
        command.upgrade(_config(conn), "0002")
        conn.commit()
    # A context made by the 0002-era server, with a ledger: 3 answers, mu^2 0.25 spent.
    body = voting_context(budget={"epsilon": 50.0, "delta": 1e-5})
    cid = "ctx_" + "a" * 24
    mech = calibrate_mechanism(ContextSpec.model_validate(body))
    with eng.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO dpicl_contexts (id, name, task, labels, exemplars, template, "
                "mechanism, budget, mu2_spent, mu2_max, queries, max_queries, created_at) "
                "VALUES (:id, 'old', 'classification', :labels, :ex, :tpl, :mech, :budget, "
                "0.25, 100.0, 3, NULL, '2026-01-01 00:00:00')"
            ),
            {
                "id": cid,
                "labels": '["Yes", "No"]',
                "ex": _json(body["exemplars"]),
                "tpl": body["template"],
                "mech": _json(mech),
                "budget": _json(body["budget"]),
            },
        )
    eng.dispose()
    with make_client(tmp_path) as c:  # the new server upgrades it in place
        info = c.get(f"/v1/contexts/{cid}", headers=admin_headers()).json()
        assert info["spent"]["queries"] == 3 and info["tenant"] is None
        r = _ask(c, cid, user_headers())  # the static key (DPICL_API_KEYS) still answers
        assert r.status_code == 200, r.text
        assert r.json()["budget"]["queries"] == 4
        assert _ask(c, cid, bearer(ADMIN)).status_code == 200
        spend = c.get(f"/v1/contexts/{cid}/spend", headers=admin_headers()).json()
        # Charges made before the upgrade have no spend rows; every one since has.
        assert [t["key_id"] for t in spend["by_key"]] == ["admin", static_key_id(USER)]
    eng = sa.create_engine(f"sqlite:///{db}")
    with eng.connect() as conn:
        version = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
        mu2 = conn.execute(sa.text("SELECT mu2_spent FROM dpicl_contexts")).scalar()
    eng.dispose()
    assert version == head() == "0005"
    assert mu2 is not None and mu2 > 0.25


def _json(value: object) -> str:
    return json.dumps(value)


def test_every_request_names_its_key_for_the_access_log(tmp_path: Path) -> None:
    seen: list[str | None] = []
    c = make_client(tmp_path)

    @c.app.middleware("http")  # type: ignore[attr-defined]
    async def record(request: Any, call_next: Any) -> Any:
        response = await call_next(request)
        seen.append(getattr(request.state, "key_id", None))
        return response

    with c:
        cid = c.post("/v1/contexts", json=voting_context(), headers=admin_headers()).json()["id"]
        key = c.post("/v1/keys", json={"contexts": [cid]}, headers=admin_headers()).json()
        _ask(c, cid, user_headers())
        _ask(c, cid, bearer(key["secret"]))
        _ask(c, cid, bearer("dpk_not-a-key"))
    assert seen == ["admin", "admin", static_key_id(USER), key["id"], None]
    assert static_key_id(USER).startswith("static-") and len(static_key_id(USER)) == 15
    assert USER not in static_key_id(USER)


def test_a_budgeted_key_is_refused_on_dps_mozo_and_an_unbudgeted_one_answers(
    tmp_path: Path,
) -> None:
    from tests.server.test_api_mozo import QUERY, mozo_context

    with make_client(tmp_path) as c:
        cid = c.post("/v1/contexts", json=mozo_context(), headers=admin_headers()).json()["id"]
        budgeted = c.post(
            "/v1/keys", json={"contexts": [cid], "budget": budget_for(4)}, headers=admin_headers()
        ).json()
        plain = c.post("/v1/keys", json={"contexts": [cid]}, headers=admin_headers()).json()
        ask = {"context_id": cid, "query": QUERY}
        r = c.post("/v1/generate", json=ask, headers=bearer(budgeted["secret"]))
        assert r.status_code == 422, r.text
        assert "dps-mozo" in r.json()["error"]["message"]
        r = c.post("/v1/generate", json=ask, headers=bearer(plain["secret"]))
        assert r.status_code == 200, r.text
        spend = c.get(f"/v1/contexts/{cid}/spend", headers=admin_headers()).json()
        assert [(t["key_id"], t["answered"]) for t in spend["by_key"]] == [(plain["id"], 1)]


def test_a_key_revoked_after_its_request_was_authenticated_is_not_charged(
    tmp_path: Path,
) -> None:
    import asyncio

    from dpicl.store.charges import Refused
    from dpicl.store.keys import find_by_secret, revoke_key

    with make_client(tmp_path) as c:
        cid = c.post("/v1/contexts", json=voting_context(), headers=admin_headers()).json()["id"]
        key = c.post("/v1/keys", json={"contexts": [cid]}, headers=admin_headers()).json()
        repo = c.app.state.services.repo  # type: ignore[attr-defined]

        async def race() -> object:
            found = await repo.run(lambda conn: find_by_secret(conn, key["secret"]))
            principal = found.principal()  # authenticated...
            await repo.run(lambda conn: revoke_key(conn, key["id"]), write=True)  # ...revoked
            return await repo.charge(repo.charge_request(cid, principal, 0.1, 1.0, 1e-5))

        assert asyncio.run(race()) == Refused("revoked")
        info = c.get(f"/v1/contexts/{cid}", headers=admin_headers()).json()
        assert info["spent"]["queries"] == 0


def test_the_openai_surface_keeps_a_keys_scope_and_budget(tmp_path: Path) -> None:
    """A key scoped to a tenant lists only its models, and a model outside its scope reads
    as unknown (404 model_not_found, the answer for an id that does not exist), also as
    a listing cursor; its answers are charged to its own budget and its spend rows."""
    with make_client(tmp_path) as c:
        mine = c.post(
            "/v1/contexts", json=voting_context(tenant="acme"), headers=admin_headers()
        ).json()["id"]
        other = c.post("/v1/contexts", json=voting_context(), headers=admin_headers()).json()["id"]
        key = c.post(
            "/v1/keys", json={"tenant": "acme", "budget": budget_for(1)}, headers=admin_headers()
        ).json()
        h = bearer(key["secret"])
        assert [m["id"] for m in c.get("/v1/models", headers=h).json()["data"]] == [mine]
        listed = {m["id"] for m in c.get("/v1/models", headers=user_headers()).json()["data"]}
        assert listed == {mine, other}  # a static key reaches every context
        missing = "ctx_" + "0" * 24
        for model in (other, missing):
            r = c.get(f"/v1/models/{model}", headers=h)
            assert (r.status_code, r.json()["error"]["code"]) == (404, "model_not_found")
            chat = {"model": model, "messages": [{"role": "user", "content": "q"}]}
            r = c.post("/v1/chat/completions", json=chat, headers=h)
            assert (r.status_code, r.json()["error"]["code"]) == (404, "model_not_found")
            r = c.get("/v1/models", params={"after": model}, headers=h)
            assert (r.status_code, r.json()["error"]["param"]) == (404, "after"), r.text
            assert r.json()["error"]["code"] == "model_not_found"
        chat = {"model": mine, "messages": [{"role": "user", "content": "q"}]}
        assert c.post("/v1/chat/completions", json=chat, headers=h).status_code == 200
        # The key's own budget (one answer) is spent: the next is refused, nothing charged.
        r = c.post("/v1/chat/completions", json=chat, headers=h)
        assert (r.status_code, r.json()["error"]["code"]) == (402, "budget_exhausted")
        assert "Retry-After" not in r.headers and r.headers["x-should-retry"] == "false"
        spend = c.get(f"/v1/contexts/{mine}/spend", headers=admin_headers()).json()
        totals = {t["key_id"]: t for t in spend["by_key"]}
        assert totals[key["id"]]["answered"] == 1 and totals[key["id"]]["refused"] == 1
        assert spend["queries"] == 1
        # A rate limit is not a budget: 429 rate_limited keeps its Retry-After.
        limited = c.post(
            "/v1/keys", json={"tenant": "acme", "rate_limit": 1}, headers=admin_headers()
        ).json()
        hl = bearer(limited["secret"])
        assert c.post("/v1/chat/completions", json=chat, headers=hl).status_code == 200
        r = c.post("/v1/chat/completions", json=chat, headers=hl)
        assert (r.status_code, r.json()["error"]["code"]) == (429, "rate_limited")
        assert int(r.headers["Retry-After"]) >= 1 and "x-should-retry" not in r.headers
