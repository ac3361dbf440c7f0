"""Free-text generation of the transformers engine (ESA's partition and candidate texts).

Calls merged by the engine's generate batcher arrive here as jobs of token ids (tokenised
before the engine's thread). Jobs with the same
settings (``max_tokens``, temperature, stop strings) run as one batch, others as batches of
their own in the same engine run. Every job samples from its own generator, seeded from its
``GenerationParams.seed`` (the pipelines pass OS entropy): rows of one job are drawn together,
in the order they would be drawn were the job alone, so a job's text does not depend on what
it was batched with (up to float rounding of the batched forward). Each batch is encoded on
top of its rows' cached prefixes, then decoded one token per forward over the KV cache.
These functions run under the engine's model lock (:meth:`~.runner.ModelRunner.run`).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence

import torch

from dpicl.engines.base import GenerationParams
from dpicl.engines.prompting import EncodedPrompt
from dpicl.engines.transformers.past import prefill_rows
from dpicl.engines.transformers.runner import ModelRunner, Row

log = logging.getLogger("dpicl.engines")

__all__ = ["GenJob", "generate_chunk", "generate_jobs", "sample"]

#: One call: its prompts encoded (tokenised before the engine's thread) and its settings.
GenJob = tuple[list[EncodedPrompt], GenerationParams]


def generate_jobs(engine: ModelRunner, jobs: list[GenJob]) -> list[list[str] | BaseException]:
    """Generate for several calls: calls with the same settings (all but the seed) run
    as one batch; every call samples from its own generator."""
    results: list[list[str] | BaseException] = [[] for _ in jobs]
    groups: dict[tuple[int, float, tuple[str, ...]], list[int]] = {}
    for j, (_, params) in enumerate(jobs):
        groups.setdefault((params.max_tokens, params.temperature, params.stop), []).append(j)
    for members in groups.values():
        rows: list[Row] = []
        owner: list[int] = []
        gens: dict[int, torch.Generator] = {}
        for j in members:
            prompts, params = jobs[j]
            enc = [engine.row_of(p) for p in prompts]
            seed = params.seed if params.seed is not None else secrets.randbits(63)
            gens[j] = torch.Generator(device=engine.device)
            gens[j].manual_seed(int(seed) % (2**63))
            results[j] = [""] * len(prompts)
            rows.extend(enc)
            owner.extend([j] * len(enc))
        if not rows:
            continue
        params = jobs[members[0]][1]
        first = {j: owner.index(j) for j in gens}
        widths = [len(r.ids) + params.max_tokens for r in rows]
        try:
            for chunk in engine.chunks([1] * len(rows), widths):
                outs = generate_chunk(
                    engine, [rows[i] for i in chunk], params, [gens[owner[i]] for i in chunk]
                )
                for i, text in zip(chunk, outs, strict=True):
                    res = results[owner[i]]
                    assert isinstance(res, list)
                    res[i - first[owner[i]]] = text
        except Exception as exc:  # the model failed: every call of the group fails
            for j in gens:
                results[j] = exc
    return results


#: What :func:`sample` gives a row whose next-token distribution is not finite: the row
#: ends there, as at an end-of-sequence token.
UNUSABLE = -1


def sample(logits: torch.Tensor, temperature: float, gens: Sequence[torch.Generator]) -> list[int]:
    """One token per row; row b's draw comes from ``gens[b]`` (rows sharing a generator
    are drawn together, in order, as a call batched alone would draw them).

    A row whose distribution is not finite (a NaN logit, or a softmax that is not finite:
    the model's numerics failed on that row) gets :data:`UNUSABLE` and its uniform is still
    drawn, so the other rows' draws do not move. A partition's text then ends there, which
    is still a function of that partition alone (ESA's sensitivity holds); failing the
    whole call would release whether some private prompt's numerics failed.

    Inverse-CDF sampling: one uniform draw per row, located in the row's cumulative
    distribution (float64: the cumulative sum over 49,152 entries is off by at most about
    5e-12 of mass, so that is all rounding can move; a zero-probability token is never
    drawn). ``torch.multinomial`` draws one
    exponential per vocabulary entry instead: 12.6 ms a step for ten rows of SmolLM2's
    49,152 tokens, 7.6% of a ten-partition generation in a profile on the development
    machine.
    """
    if temperature == 0:
        ok = (~torch.isnan(logits).any(dim=-1)).tolist()
        return [
            int(t) if o else UNUSABLE
            for t, o in zip(logits.argmax(dim=-1).tolist(), ok, strict=True)
        ]
    cdf = torch.softmax(logits.double() / temperature, dim=-1).cumsum_(dim=-1)
    total = cdf[:, -1]
    usable = torch.isfinite(total) & (total > 0)
    if not bool(usable.all()):
        cdf = torch.where(usable[:, None], cdf, torch.ones_like(cdf))  # searchable; unused
        total = torch.where(usable, total, torch.ones_like(total))
    out = [0] * len(gens)
    last = cdf.shape[-1] - 1
    by_gen: dict[int, list[int]] = {}
    for b, g in enumerate(gens):
        by_gen.setdefault(id(g), []).append(b)
    for idx in by_gen.values():
        u = torch.rand(len(idx), dtype=torch.float64, generator=gens[idx[0]], device=cdf.device)
        if len(idx) == len(gens):  # one generator for all rows (in order): no gather
            rows, mass = cdf, total
        else:
            sel = torch.tensor(idx, dtype=torch.long, device=cdf.device)
            rows, mass = cdf.index_select(0, sel), total.index_select(0, sel)
        # The first token whose cumulative mass exceeds u * total: P(token i) = p_i.
        draws = torch.searchsorted(rows, (u * mass)[:, None], right=True)
        for b, t in zip(idx, draws[:, 0].clamp_(max=last).tolist(), strict=True):
            out[b] = int(t)
    if not bool(usable.all()):
        for b in torch.nonzero(~usable).flatten().tolist():
            out[b] = UNUSABLE
    return out


def generate_chunk(
    engine: ModelRunner,
    rows: list[Row],
    params: GenerationParams,
    gens: Sequence[torch.Generator],
) -> list[str]:
    n = len(rows)
    pre = prefill_rows(engine, rows, decode_steps=params.max_tokens)
    cache = pre.res.past_key_values
    logits = pre.res.logits[:, -1, :]
    attn = pre.attention_mask
    pos = pre.last_pos
    out: list[list[int]] = [[] for _ in range(n)]
    done = [False] * n
    texts: list[str | None] = [None] * n
    unusable = 0
    eos = engine.eos_token_ids
    for step in range(params.max_tokens):
        nxt = sample(logits, params.temperature, gens)
        for b in range(n):
            if done[b]:
                continue
            tok = nxt[b]
            if tok == UNUSABLE:
                # The text stands as it is (see sample); the operator should still hear
                # that the model's numerics failed (a count, never a prompt).
                unusable += 1
                done[b] = True
                continue
            if tok in eos:
                done[b] = True
                continue
            out[b].append(tok)
            if params.stop:
                text = engine.tokenizer.decode(out[b], skip_special_tokens=True)
                cut = min((text.find(s) for s in params.stop if s and s in text), default=-1)
                if cut >= 0:
                    texts[b] = text[:cut]
                    done[b] = True
        if all(done) or step == params.max_tokens - 1:
            break
        tokens = torch.tensor(
            [engine.pad_token_id if done[b] else nxt[b] for b in range(n)],
            dtype=torch.long,
            device=engine.device,
        )[:, None]
        attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype, device=attn.device)], 1)
        pos = pos + 1
        res = engine.forward(tokens, attn, pos[:, None], past=cache, use_cache=True)
        logits = res.logits[:, -1, :]
    if unusable:
        log.warning(
            "%d of %d generated rows ended early: their next-token distributions were not finite",
            unusable,
            n,
        )
    result = []
    for b in range(n):
        text = texts[b]
        if text is None:
            text = engine.tokenizer.decode(out[b], skip_special_tokens=True)
        result.append(text.strip())
    return result
