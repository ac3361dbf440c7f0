"""Laplace-noise private voting: a DP mechanism added to dpicl from outside its packages.

The server half is :mod:`laplace_voting.server`, registered under the entry point
``laplace-voting`` of group ``dpicl.mechanisms``.
"""
