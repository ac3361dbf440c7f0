"""The audited mechanisms: one package each, one :class:`~.base.MechanismAudit` protocol.

============  =================  ==============================================
name          package            what it releases
============  =================  ==============================================
voting        :mod:`.voting`     a label: noisy argmax of T partition votes
esa           :mod:`.esa`        a text: zero-shot candidate nearest a noisy mean
dps-mozo      :mod:`.dps_mozo`   a text: tokens from mixed one-shot products
============  =================  ==============================================

Each package holds its design (data, ``design.py``), its audit (context bodies, trials,
estimates, ``audit.py``), its bootstrap where one exists, and its extras. Beside them:

* :mod:`.base`: the protocol and the Gaussian-mechanism helpers voting and ESA share;
* :mod:`.neighbours`: the replace-one helpers every design uses;
* :mod:`.trial_estimates`: the trials' figures and verdicts every audit reads;
* :mod:`.names`: the mechanism names, known without importing the audits (plan validation);
* :mod:`.registry`: the one registry (:data:`~.registry.MECHANISMS`,
  :func:`~.registry.get_mechanism`, :func:`~.registry.load_design`), with the audits other
  packages register through the ``dpicl_audit.mechanisms`` entry point group.

Imports run one way: ``names``, ``neighbours``, ``trial_estimates`` <- ``base`` <- each
package (design <- estimates <- audit) <- ``registry``. This module imports nothing, so that
importing a submodule never loads them all.
"""
