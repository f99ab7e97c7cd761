"""Adapters that plug shellseam into agent frameworks that other people wrote.

Each submodule targets one framework and imports it, so it is only importable with the
matching extra installed (``shellseam[minisweagent]``); this package itself imports nothing.
"""
