"""The server's generic privacy mathematics and budget bookkeeping (what is specific to one
mechanism lives in its folder under :mod:`dpicl.mechanisms`).

* :mod:`~dpicl.privacy.calibration`: sigma from (epsilon, delta) for a Gaussian mechanism
  (classic Dwork-Roth formula of paper 000, Algorithm 2 line 7, or the analytic calibration
  of Balle and Wang 2018), the exact Gaussian privacy curve and dp-accounting's PLD epsilon.
* :mod:`~dpicl.privacy.accounting`: the ledger's units (mu^2 of Gaussian DP), composition,
  pure epsilon-DP in those units, budgets and what is left of them.
* :mod:`~dpicl.privacy.ledger`: the cost event (``Cost``) and the stateful budget ledger
  over the store, which composes events without knowing their mechanism.
* :mod:`~dpicl.privacy.randomness`: where DP randomness comes from.
"""
