"""Private voting's exact epsilon, computed independently of the server (dp-accounting's PLD
accountant through :func:`dpicl_audit.estimators.exact.gaussian_epsilon_exact`)."""

from __future__ import annotations

from dpicl_audit.estimators.exact import VOTING_SENSITIVITY, gaussian_epsilon_exact

__all__ = ["voting_epsilon_exact"]


def voting_epsilon_exact(sigma: float, delta: float, count: int = 1) -> float:
    """epsilon at ``delta`` of private voting with Gaussian noise ``sigma`` on every count.

    Replacing one exemplar changes one partition's vote: one count -1 and one +1, an L2
    change of ``sqrt(2)``. The noisy histogram is then exactly the Gaussian mechanism with
    that sensitivity (the released argmax can only leak less).
    """
    return gaussian_epsilon_exact(sigma, VOTING_SENSITIVITY, delta, count)
