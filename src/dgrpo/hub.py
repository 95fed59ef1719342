"""Whether the Hugging Face hub can be reached now: one TCP connection to its endpoint with a short timeout.

Used before any hub lookup (models and datasets), so that a machine without network fails at once with one line
instead of waiting for the hub libraries' retries. ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` are read at call
time: with either set, the libraries' own offline mode (their local cache) is used instead of the probe. Within
:func:`one_probe` (one command's lookups) each address is probed once.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from urllib.parse import ParseResult, urlparse

HUB_TIMEOUT_S = 3.0  # the reachability probe; downloads then use huggingface_hub's own timeouts
DEFAULT_ENDPOINT = "https://huggingface.co"
#: the answers of the probes made within :func:`one_probe`, by address (None: outside it, every call probes)
_ANSWERS: ContextVar[dict[tuple[str, int], bool] | None] = ContextVar("hub_answers", default=None)


def offline_requested(*names: str) -> bool:
    """True when one of the environment variables ``names`` (default: HF_HUB_OFFLINE) is set to a true value."""
    return offline_variable(*names) is not None


def offline_variable(*names: str) -> str | None:
    """The first of the environment variables ``names`` (default: HF_HUB_OFFLINE) set to a true value, which an
    error line names (and says to unset); None when none is."""
    return next(
        (
            n
            for n in names or ("HF_HUB_OFFLINE",)
            if os.environ.get(n, "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        ),
        None,
    )


def _proxy_for(host: str, scheme: str = "https") -> str | None:
    """The proxy URL the hub libraries would use for a ``scheme`` request to ``host`` (None: a direct connection),
    read as they read it (``urllib.request.getproxies``: the lower-case variable wins over the upper-case one, an
    empty one unsets it; the scheme's own proxy before ALL_PROXY). It was HTTPS_PROXY before https_proxy, for an
    http endpoint too: the probe tried a proxy the libraries did not use."""
    from urllib.request import getproxies, proxy_bypass

    proxies = getproxies()
    proxy = proxies.get(scheme) or proxies.get("all")
    return None if not proxy or proxy_bypass(host) else proxy


def _connects(host: str, port: int, timeout: float) -> bool:
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


class EndpointError(ValueError):
    """``HF_ENDPOINT`` is not a URL the hub libraries can build their requests on."""


def hub_endpoint() -> ParseResult:
    """``HF_ENDPOINT`` (default https://huggingface.co) parsed; :class:`EndpointError` when it is not an http(s) URL
    with a host. The hub libraries prefix every request with it as it is written, so one without a scheme
    (``hf-mirror.com``) fails in them on every request; the probe tried huggingface.co instead."""
    value = os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT)
    url = urlparse(value)
    if url.scheme not in ("http", "https") or not url.hostname:
        bare = value.strip().split("://")[-1].strip("/")
        fix = f"set it to https://{bare}" if bare else "unset it for huggingface.co"
        raise EndpointError(f"HF_ENDPOINT={value!r} is not an http:// or https:// URL (the hub's address): {fix}")
    return url


@contextmanager
def one_probe() -> Iterator[None]:
    """Within it, :func:`hub_reachable` probes each address once and answers again as it first did: one command
    that looks a hub id up more than once (dgrpo eval: its settings, then its weights) waits out the probe's timeout
    once at most (it was once per lookup: 3 s each on a network that drops packets)."""
    token = _ANSWERS.set({})
    try:
        yield
    finally:
        _ANSWERS.reset(token)


def hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """Can a TCP connection to the hub endpoint (``HF_ENDPOINT``: :func:`hub_endpoint`, which raises
    :class:`EndpointError` for one that is not a URL) be opened within ``timeout`` seconds? With a proxy set
    (https_proxy, ALL_PROXY, ...: :func:`_proxy_for`), the hub libraries go through it: then the proxy is what is
    probed (a proxy that cannot be reached had them retry for ~50 s before a cached model was used). Within
    :func:`one_probe`, an address probed before is not probed again."""
    url = hub_endpoint()
    host = url.hostname or ""
    proxy = _proxy_for(host, "http" if url.scheme == "http" else "https")
    if proxy is not None:
        p = urlparse(proxy if "://" in proxy else f"http://{proxy}")
        address = (p.hostname or "", p.port or (443 if p.scheme == "https" else 80))
    else:
        address = (host, url.port or (80 if url.scheme == "http" else 443))
    answers = _ANSWERS.get()
    if answers is not None and address in answers:
        return answers[address]
    reachable = _connects(*address, timeout)
    if answers is not None:
        answers[address] = reachable
    return reachable
