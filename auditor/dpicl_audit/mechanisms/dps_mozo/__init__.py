"""DPS-MOZO (paper 004, Algorithm 1): a text decoded token by token from mixed one-shot
distributions, each token pure ``per_token_epsilon``-DP (proven mode).

Imports run one way, top to bottom of this table (the registry imports :mod:`.audit`):

==================  ============================================================
module              what it holds
==================  ============================================================
:mod:`.settings`    the audit settings (the plan's section, its plan checks)
:mod:`.design`      the neighbour design as data, its builder and decision rule
:mod:`.facts`       DPS-MOZO's own facts of a setting (MozoFacts: the per-token bound)
:mod:`.check`       the auditor's own recomputation of a token's bounds
:mod:`.claim`       the exact epsilon of the reported eps0 against the claim; the
                    per-token bound the positions probe reads (probes.positions)
:mod:`.findings`    divergence and neighbour-ratio findings over a setting's rows
:mod:`.legacy`      logs of the old separate DPS-MOZO audit, read as pipeline runs
:mod:`.audit`       :class:`~.audit.MozoAudit`: context bodies, trials, estimates
==================  ============================================================

There is no bootstrap: DPS-MOZO has no clean internal state to resample.
"""
