"""The server's privacy mathematics and budget bookkeeping.

* :mod:`~dpicl.privacy.calibration`: sigma from (epsilon, delta) for a Gaussian mechanism
  (classic Dwork-Roth formula of paper 000, Algorithm 2 line 7, or the analytic calibration
  of Balle and Wang 2018), the exact Gaussian privacy curve and dp-accounting's PLD epsilon.
* :mod:`~dpicl.privacy.accounting`: the ledger's units (mu^2 of Gaussian DP), composition,
  budgets and what is left of them.
* :mod:`~dpicl.mechanisms.dps_mozo.calibration`: beta for DPS-MOZO (paper 004, Theorems A.3/A.4).
* :mod:`~dpicl.privacy.ledger`: the stateful budget ledger over the store.
* :mod:`~dpicl.privacy.randomness`: where DP randomness comes from.
"""
