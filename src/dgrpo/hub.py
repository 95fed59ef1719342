"""Whether the Hugging Face hub can be reached now: one TCP connection to its endpoint with a short timeout.

Used before any hub lookup (models and datasets), so that a machine without network fails at once with one line
instead of waiting for the hub libraries' retries. ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` are read at call
time: with either set, the libraries' own offline mode (their local cache) is used instead of the probe.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

HUB_TIMEOUT_S = 3.0  # the reachability probe; downloads then use huggingface_hub's own timeouts
DEFAULT_ENDPOINT = "https://huggingface.co"


def offline_requested(*names: str) -> bool:
    """True when one of the environment variables ``names`` (default: HF_HUB_OFFLINE) is set to a true value."""
    return any(
        os.environ.get(n, "").strip().upper() in {"1", "ON", "YES", "TRUE"} for n in names or ("HF_HUB_OFFLINE",)
    )


#: with one of these set, the hub is reached through a proxy, which the hub libraries use and a TCP probe would not
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """Can a TCP connection to the hub endpoint (``HF_ENDPOINT``) be opened within ``timeout`` seconds? True without
    a probe when a proxy is set (:data:`PROXY_VARIABLES`): the hub libraries then go through it."""
    if any(os.environ.get(v) for v in PROXY_VARIABLES):
        return True
    url = urlparse(os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT))
    try:
        socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False
