"""Private voting (paper 000, Algorithm 2): a label released by a noisy argmax of T votes.

Imports run one way, top to bottom of this table (the registry imports :mod:`.audit`):

==================  ============================================================
module              what it holds
==================  ============================================================
:mod:`.settings`    the audit settings (the plan's section, attacks, plan checks)
:mod:`.design`      the neighbour design as data (stored with a run as JSON)
:mod:`.build`       building the ``paper``, ``pivotal`` and ``identical`` designs
:mod:`.rdp`         paper 003's adversaries: the query-sequence design, built
:mod:`.exact`       the exact epsilon (dp-accounting PLD), independent of the server
:mod:`.bootstrap`   Algorithm 1: clean votes resampled with the server's noise, the
                    simulated releases vectorised (estimators take the decisions and scores)
:mod:`.rdp_estimates`  paper 003's RDP audit of a sequence's votes
:mod:`.estimates`   one setting's estimates, the exact epsilons beside them, and its
                    conformance tests (noise, release rates) read into its verdicts
:mod:`.audit`       :class:`~.audit.VotingAudit`: context bodies, trials, estimates
==================  ============================================================
"""
