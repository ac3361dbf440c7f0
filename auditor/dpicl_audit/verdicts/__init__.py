"""Verdicts: what an estimate's lower bound says about the server's claims.

One place decides the words of every verdict, so that new audit designs (and the
INCONCLUSIVE verdict of an audit that could not have seen a violation) extend it here:

* ``violation``: epsilon_emp exceeds epsilon_theory (the claim is broken);
* ``bug``: epsilon_emp exceeds epsilon_exact, the mechanism's true epsilon at the noise the
  server reports (the server or the auditor is wrong);
* ``inconclusive`` (Gaussian claims, :func:`gaussian_verdict`): the audit could not have seen
  a violation (:func:`~dpicl_audit.estimators.verdict_rules.decide_verdict`), or a figure
  exceeds alone but not with the run's other tests held together at the same confidence
  (:mod:`~dpicl_audit.estimators.family`; :func:`for_the_family` for DPS-MOZO's figures,
  :func:`claim_for_the_family` for paper 003's RDP cuts); it says why and what to change;
* ``nonconforming``: the releases depart from the distribution the design predicts
  (:mod:`~dpicl_audit.estimators.conformance`, applied by each mechanism's estimate after
  these rules); it replaces ``inconclusive`` and ``ok``, never a violation or bug;
* ``ok``: neither (CONSISTENT: the audit had power and found nothing above the claim); for
  a *nominal* claim (DPS-MOZO's, whose per-token bound is false) the message says that
  staying below it confirms nothing.

:func:`gaussian_verdict` (voting, ESA), :func:`verdict` (DPS-MOZO's nominal claim) and
:func:`rdp_verdict` return a :class:`Verdict`, the one verdict type; its :meth:`Verdict.to_dict`
is the JSON stored under ``"verdict"`` in every estimate, and :meth:`Verdict.from_dict` reads
it back. A :class:`Status` knows its severity and the CLI's exit code.

Modules::

    model.py   the one verdict type (Verdict, GaussianVerdict), Status, a run's worst
               status (the run's Family is :mod:`dpicl_audit.claims`', re-exported)
    claims.py  the claims a bound may state: verdict, gaussian_verdict, rdp_verdict, and
               for the run's tests together; each reads a setting's typed claims
               (:class:`~dpicl_audit.claims.SettingClaims`)
"""

from __future__ import annotations

from dpicl_audit.verdicts import claims, model
from dpicl_audit.verdicts.claims import *  # noqa: F403
from dpicl_audit.verdicts.model import *  # noqa: F403

__all__ = [*model.__all__, *claims.__all__]
