"""The run's server contexts: created, or adopted after a crash, and verified either way.

Every context a run uses is recorded in the trial log (``run_contexts``) and named
``dpicl-audit <run> <setting> C<world>`` on the server (``... C<world> #<slot>`` for the
further contexts of a mechanism whose contexts answer a limited number of queries: DPS-MOZO,
or voting and ESA where one budget cannot hold a world's trials). A context is:

* **reused** when the log records it and the server still has it;
* **adopted** when the server holds one under the run's name (created just before a crash,
  before it reached the log);
* **created** otherwise.

A reused or adopted context must match what the audit would create now, not only by name:
the body's *fingerprint* (a hash of task, labels, template, exemplars and mechanism
settings) is stored with the record and compared on reuse, and an adopted context's
mechanism record, size, labels and template are compared with the body field by field. A
mismatch raises :class:`~dpicl_audit.errors.TargetProtocolError` naming the field.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping, Sequence

from dpicl_audit.client import ContextBody
from dpicl_audit.context_info import ContextInfo, context_info
from dpicl_audit.errors import TargetError, TargetNotFound, TargetProtocolError
from dpicl_audit.jsontypes import JsonMapping
from dpicl_audit.pipeline.run_context import RunContext
from dpicl_audit.store import ContextRecord

__all__ = ["ContextBook", "fingerprint", "mismatches"]


def fingerprint(body: ContextBody) -> str:
    """A hash of everything that makes two contexts the same mechanism over the same data."""
    sent: Mapping[str, object] = body
    keep = {k: sent.get(k) for k in ("task", "labels", "template", "exemplars", "mechanism")}
    text = json.dumps(keep, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def mismatches(info: ContextInfo, body: ContextBody) -> list[str]:
    """Fields where a server context differs from the body the audit would send."""
    out = []
    mech: Mapping[str, object] = info.get("mechanism") or {}
    want = body["mechanism"]
    for key, value in want.items():
        got = mech.get(key)
        if got is not None and key != "name" and _differs(got, value):
            out.append(f"mechanism.{key} {got!r} (audit: {value!r})")
    if mech.get("name") not in (None, want.get("name")):
        out.append(f"mechanism.name {mech.get('name')!r} (audit: {want.get('name')!r})")
    n = info.get("n_exemplars")
    if n is not None and int(n) != len(body["exemplars"]):
        out.append(f"n_exemplars {n} (audit: {len(body['exemplars'])})")
    # Read by a key named at run time: both records as plain mappings.
    record: Mapping[str, object] = info
    sent: Mapping[str, object] = body
    for key in ("task", "labels", "template"):
        if key in sent and record.get(key) is not None and record.get(key) != sent[key]:
            out.append(f"{key} differs")
    return out


def _differs(got: object, want: object) -> bool:
    if isinstance(want, str) != isinstance(got, str):
        return False  # a derived value (ESA's "tight" reported as the number 2/T)
    if isinstance(want, float | int) and isinstance(got, float | int):
        return abs(float(got) - float(want)) > 1e-12 * max(1.0, abs(float(want)))
    return bool(got != want)


class ContextBook:
    """The contexts of one run: lookup, creation, adoption and replacement."""

    def __init__(self, run: RunContext) -> None:
        self.run_ctx = run
        self._listing: Sequence[JsonMapping] | None = None
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._cache: dict[tuple[str, int], ContextRecord] = {}
        #: Every context this book created or adopted, in the log or not (a spent one that
        #: was replaced, one refused by the checks): :meth:`delete_all` deletes them too.
        self._seen: set[str] = set()
        #: The contexts the last :meth:`delete_all` could not delete.
        self.undeleted: list[str] = []

    @staticmethod
    def key(setting: str, slot: int) -> str:
        """The log's setting key of a slot: the setting itself for the first context."""
        return setting if slot == 0 else f"{setting}#{slot}"

    def name(self, setting: str, world: int, slot: int = 0, generation: int = 0) -> str:
        base = f"dpicl-audit {self.run_ctx.run_id} {setting} C{world}"
        if slot:
            base += f" #{slot}"
        return base + (f" r{generation}" if generation else "")

    async def pair(self, setting: str, epsilon: float) -> dict[int, ContextRecord]:
        """C1 and C0 of one epsilon (slot 0), checked to share one mechanism."""
        out = {w: await self.get(setting, epsilon, w) for w in (1, 0)}
        self.run_ctx.mechanism.check_pair(setting, out[1], out[0])
        return out

    async def get(self, setting: str, epsilon: float, world: int, slot: int = 0) -> ContextRecord:
        """The context of (setting, world, slot): reused, adopted or created."""
        key = (self.key(setting, slot), world)
        if key in self._cache:
            return self._cache[key]
        async with self._locks.setdefault(key, asyncio.Lock()):
            if key in self._cache:
                return self._cache[key]
            rec = await self._resolve(setting, epsilon, world, slot)
            self._cache[key] = rec
            return rec

    async def replace(
        self, setting: str, epsilon: float, world: int, slot: int, spent: ContextRecord
    ) -> ContextRecord:
        """A fresh context in place of a spent one (DPS-MOZO, after a crash)."""
        key = (self.key(setting, slot), world)
        async with self._locks.setdefault(key, asyncio.Lock()):
            current = self._cache.get(key)
            if current is not None and current.context_id != spent.context_id:
                return current  # another worker replaced it already
            gen = int(spent.info.get("audit_generation", 0)) + 1
            name = self.name(setting, world, slot, gen)
            rec = await self._create(setting, epsilon, world, slot, name, generation=gen)
            self._cache[key] = rec
            return rec

    async def _resolve(self, setting: str, epsilon: float, world: int, slot: int) -> ContextRecord:
        body = self._body(epsilon, world, setting, slot)
        rec = self.run_ctx.store.contexts(self.run_ctx.run_id).get((self.key(setting, slot), world))
        if rec is not None:
            stored = rec.info.get("audit_fingerprint")
            if stored is not None and stored != fingerprint(body):
                raise TargetProtocolError(
                    f"context {rec.context_id} ({setting}, C{world}) was created with other "
                    "settings than this audit's (fingerprint differs); start a new run"
                )
            try:
                await self.run_ctx.target.get_context(rec.context_id)
                return rec
            except TargetNotFound:
                self.run_ctx.console.print(
                    f"[yellow]context {rec.context_id} ({setting}, C{world}) is gone from "
                    "the server; creating an identical one[/yellow]"
                )
        info = await self._adoptable(str(body["name"]))
        if info is not None:
            bad = mismatches(info, body)
            if bad:
                raise TargetProtocolError(
                    f"context {info.get('id')} is named {body['name']!r} but differs from the "
                    f"audit's: {'; '.join(bad)}"
                )
            return self._save(setting, epsilon, world, slot, info, generation=0)
        return await self._create(setting, epsilon, world, slot, str(body["name"]))

    async def _adoptable(self, name: str) -> ContextInfo | None:
        if self._listing is None:
            try:
                self._listing = await self.run_ctx.target.list_contexts()
            except TargetError:
                self._listing = []
        found = next((c for c in self._listing if c.get("name") == name), None)
        return None if found is None else context_info(found)

    def _body(self, epsilon: float, world: int, setting: str, slot: int) -> ContextBody:
        name = self.name(setting, world, slot)
        body: ContextBody = self.run_ctx.mechanism.context_body(
            self.run_ctx.design, self.run_ctx.plan, epsilon, world, name=name
        )
        return body

    async def _create(
        self, setting: str, epsilon: float, world: int, slot: int, name: str, generation: int = 0
    ) -> ContextRecord:
        body = self._body(epsilon, world, setting, slot) | {"name": name}
        info = context_info(await self.run_ctx.target.create_context(body))
        return self._save(setting, epsilon, world, slot, info, generation=generation)

    def _save(
        self,
        setting: str,
        epsilon: float,
        world: int,
        slot: int,
        info: ContextInfo,
        *,
        generation: int,
    ) -> ContextRecord:
        self._seen.add(str(info.get("id")))
        self.run_ctx.mechanism.check_context(info, self.run_ctx.design, epsilon)
        # The fingerprint ignores the name, so a replacement carries its slot's fingerprint.
        stored: ContextInfo = {
            **info,
            "audit_fingerprint": fingerprint(self._body(epsilon, world, setting, slot)),
            "audit_generation": generation,
        }
        self.run_ctx.store.save_context(
            self.run_ctx.run_id,
            setting=self.key(setting, slot),
            world=world,
            epsilon=epsilon,
            context_id=str(info["id"]),
            info=stored,
        )
        return self.run_ctx.store.contexts(self.run_ctx.run_id)[(self.key(setting, slot), world)]

    async def delete_all(self) -> int:
        """Delete every context the run recorded, and every one this book created or adopted
        (best effort); how many went."""
        recorded = [r.context_id for r in self.run_ctx.store.contexts(self.run_ctx.run_id).values()]
        gone = 0
        self.undeleted = []
        for cid in dict.fromkeys([*recorded, *sorted(self._seen)]):
            try:
                await self.run_ctx.target.delete_context(cid)
                gone += 1
            except TargetNotFound:
                gone += 1  # deleted already (a resumed run's, or by its operator)
            except TargetError:
                self.undeleted.append(cid)
        return gone
