"""Tenancy: users, their tokens, and the quotas that keep one person from filling the
cluster."""
