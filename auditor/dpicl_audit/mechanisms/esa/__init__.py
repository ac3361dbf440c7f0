"""Embedding space aggregation (ESA; paper 000, Sections 3.4, 4.3): a text released as the
zero-shot candidate nearest a noisy mean of T partition embeddings.

Imports run one way, top to bottom of this table (the registry imports :mod:`.audit`):

==================  ============================================================
module              what it holds
==================  ============================================================
:mod:`.settings`    the audit settings (the plan's section, attacks, defaults)
:mod:`.design`      the neighbour design and signal texts as data (stored as JSON)
:mod:`.facts`       ESA's own facts of a setting (EsaFacts: sensitivity bound, signal)
:mod:`.build`       building the designs; the release's closed-form rates
:mod:`.signals`     the signal embeddings e(y1), e(y0): on the server or locally
:mod:`.estimates`   exact epsilons, the trials' estimates, the conformance tests
:mod:`.exact`       the exact epsilon (dp-accounting PLD), independent of the server
:mod:`.simulation`  Algorithm 1's simulated releases, vectorised (estimators take the
                    decisions and scores)
:mod:`.bootstrap`   Algorithm 1 over the collected clean means
:mod:`.audit`       :class:`~.audit.EsaAudit`: context bodies, trials, estimates
==================  ============================================================
"""
