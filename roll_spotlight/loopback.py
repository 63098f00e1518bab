"""Environment that makes Ray bind to 127.0.0.1 only (no imports: usable before Ray is imported).

Ray 2.60 maps localhost to a remotely reachable address unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0;
auth tokens and usage stats are switched off for local clusters. Values already set are kept, so a
user can opt out.
"""
from __future__ import annotations

import os

LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def set_loopback_env() -> None:
    for key, value in LOOPBACK_ENV.items():
        os.environ.setdefault(key, value)
