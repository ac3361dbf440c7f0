"""Pipelines: context -> partitions -> engine calls -> mechanism -> ledger -> release."""
