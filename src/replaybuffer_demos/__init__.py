"""Runnable walk-throughs behind ``replaybuffer demo``."""
