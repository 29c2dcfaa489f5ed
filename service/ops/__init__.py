"""Operator commands: check, status, orphans, abandon, reseed, offsets reset, maintain."""
