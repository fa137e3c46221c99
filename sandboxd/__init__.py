"""sandboxd: a per-user daemon that runs untrusted code under bubblewrap."""

__version__ = "0.1.0"
