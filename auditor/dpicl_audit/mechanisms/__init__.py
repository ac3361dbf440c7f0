"""The audited mechanisms: one package each, one :class:`~.base.MechanismAudit` protocol.

============  =================  ==============================================
name          package            what it releases
============  =================  ==============================================
voting        :mod:`.voting`     a label: noisy argmax of T partition votes
esa           :mod:`.esa`        a text: zero-shot candidate nearest a noisy mean
dps-mozo      :mod:`.dps_mozo`   a text: tokens from mixed one-shot products
============  =================  ==============================================

Each package holds its settings (the plan's ``[mechanism]`` section, the attacks it takes, its
plan checks and report lines: ``settings.py``), its design (data, ``design.py``), its audit
(context bodies, trials, estimates, ``audit.py``), its bootstrap where one exists, and its
extras. What every mechanism's settings share and the one list of them are below the plan,
in :mod:`dpicl_audit.catalog` (which loads each package's settings by name). Beside them:

* :mod:`.base`: the protocol and the helpers every audit may use;
* :mod:`.gaussian`: what the Gaussian mechanisms' audits share (voting, ESA);
* :mod:`.neighbours`: the replace-one helpers every design uses;
* :mod:`.trial_estimates`: the trials' figures and verdicts every audit reads;
* :mod:`.registry`: the audits (:data:`~.registry.MECHANISMS`,
  :func:`~.registry.get_mechanism`, :func:`~.registry.load_design`), each loaded from where
  its settings model says (``MechanismSettings.audit``).

Imports run one way: ``catalog.settings`` <- each package's settings (loaded by name by
``catalog.mechanisms``, then the plan); ``neighbours``, ``trial_estimates`` <- ``base`` <-
``gaussian`` <- each package (design <- estimates <- audit) <- ``registry``. This module
imports nothing, so that importing a submodule never loads them all.
"""
