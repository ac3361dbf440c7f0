"""GET /v1/contexts pages: `limit` contexts at a time, oldest first, continued by an opaque
keyset cursor on (created_at, id) that contexts created or deleted meanwhile do not shift.
The store's page query on SQLite and PostgreSQL, ties in created_at included."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dpicl.store.keys import INTERNAL
from dpicl.store.models import ContextRow
from dpicl.store.repository import ContextRepository, new_context_id
from tests.conftest import admin_headers
from tests.server.api_helpers import make_client, voting_context


def _pages(client: Any, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    url = f"/v1/contexts?limit={limit}"
    while True:
        r = client.get(url, headers=admin_headers())
        assert r.status_code == 200, r.text
        body = r.json()
        pages.append([c["id"] for c in body["data"]])
        if body["next"] is None:
            return pages
        url = f"/v1/contexts?limit={limit}&cursor={body['next']}"


def test_listing_pages_with_a_cursor(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        ids = []
        for i in range(5):
            r = c.post("/v1/contexts", json=voting_context(name=f"c{i}"), headers=admin_headers())
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        assert _pages(c, 2) == [ids[:2], ids[2:4], ids[4:]]
        assert _pages(c, 5) == [ids]
        whole = c.get("/v1/contexts", headers=admin_headers()).json()
        assert [x["id"] for x in whole["data"]] == ids and whole["next"] is None
        # Listed without loading the exemplars, but still counting them.
        assert {x["n_exemplars"] for x in whole["data"]} == {8}
        assert "Private record" not in c.get("/v1/contexts", headers=admin_headers()).text

        # Deleting a listed context, or creating a new one, shifts nothing between pages.
        first = c.get("/v1/contexts?limit=2", headers=admin_headers()).json()
        assert c.delete(f"/v1/contexts/{ids[1]}", headers=admin_headers()).status_code == 204
        r = c.post("/v1/contexts", json=voting_context(), headers=admin_headers())
        new = r.json()["id"]
        rest = c.get(
            f"/v1/contexts?limit=10&cursor={first['next']}", headers=admin_headers()
        ).json()
        assert [x["id"] for x in rest["data"]] == [*ids[2:], new]


@pytest.mark.parametrize(
    ("query", "names"),
    [
        ("limit=0", "limit"),
        ("limit=201", "limit"),
        ("limit=-5", "limit"),
        ("limit=two", "limit"),
        ("cursor=", "cursor"),
        ("cursor=%00%ff", "cursor"),
        ("cursor=bm90IGEgY3Vyc29y", "cursor"),  # base64url of "not a cursor"
        ("limit=5&curser=abc", "curser"),  # a misspelt cursor would list page 1 again
    ],
)
def test_bad_page_parameters_are_named(tmp_path: Path, query: str, names: str) -> None:
    with make_client(tmp_path) as c:
        r = c.get(f"/v1/contexts?{query}", headers=admin_headers())
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["param"] == names, err
        assert names in err["message"]


def _row(at: datetime, n_exemplars: int) -> ContextRow:
    return ContextRow(
        id=new_context_id(),
        name=None,
        task="generation",
        labels=[],
        exemplars=[{"input": f"i{k}", "output": f"o{k}"} for k in range(n_exemplars)],
        template="{exemplars}{query}",
        mechanism={"name": "public", "max_tokens": 4, "temperature": 0.0},
        budget=None,
        mu2_spent=0.0,
        mu2_max=None,
        queries=0,
        max_queries=None,
        created_at=at,
    )


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def repo_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'list.db'}"
    else:
        yield request.getfixturevalue("pg_url")


def test_page_query_on_both_back_ends(repo_url: str) -> None:
    """Rows sharing a created_at are ordered and continued by id; nothing is listed twice
    or skipped; the exemplar counts come from the database."""

    async def run() -> None:
        repo = ContextRepository(repo_url)
        repo.migrate()
        try:
            t0 = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
            stamps = [t0] * 4 + [t0 + timedelta(microseconds=1)] * 3 + [t0 + timedelta(days=1)]
            rows = [await repo.add(_row(at, k + 1)) for k, at in enumerate(stamps)]
            expected = sorted(rows, key=lambda r: (r.created_at, r.id))
            seen = []
            after = None
            for _ in range(10):
                page, after = await repo.list_page(3, after, principal=INTERNAL)
                seen += page
                if after is None:
                    break
            assert [s.context.id for s in seen] == [r.id for r in expected]
            assert [s.n_exemplars for s in seen] == [len(r.exemplars) for r in expected]
            assert all(s.context.exemplars == () for s in seen)
            assert [s.context.created_at for s in seen] == [r.created_at for r in expected]
        finally:
            repo.dispose()

    asyncio.run(run())
