"""The hub probe and offline switches (:mod:`dgrpo.hub`): which endpoint or proxy is probed, on which port and with
which timeout, and which values of ``HF_HUB_OFFLINE`` turn offline mode on (gaps found by mutation testing)."""

from __future__ import annotations

import pytest

from dgrpo import hub

PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy")


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, float]]:
    """No proxy and no endpoint set; ``_connects`` records (host, port, timeout) instead of opening a socket."""
    for name in (*PROXIES, "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    calls: list[tuple[str, int, float]] = []

    def connects(host: str, port: int, timeout: float) -> bool:
        calls.append((host, port, timeout))
        return True

    monkeypatch.setattr(hub, "_connects", connects)
    return calls


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        (None, ("huggingface.co", 443)),
        ("https://hf-mirror.example", ("hf-mirror.example", 443)),
        ("http://hf-mirror.example", ("hf-mirror.example", 80)),
        ("http://hf-mirror.example:8080", ("hf-mirror.example", 8080)),
        ("https://hf-mirror.example:8443/", ("hf-mirror.example", 8443)),
    ],
)
def test_the_probe_opens_the_endpoints_host_on_its_schemes_port(probed, monkeypatch, endpoint, expected):
    """HF_ENDPOINT (default https://huggingface.co) is probed at its host, on its explicit port or its scheme's
    (443 for https, 80 for http), with the timeout given."""
    if endpoint is not None:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
    assert hub.hub_reachable(timeout=1.25) is True
    assert probed == [(*expected, 1.25)]


@pytest.mark.parametrize(
    ("variable", "proxy", "expected"),
    [
        ("HTTPS_PROXY", "http://proxy.example:3128", ("proxy.example", 3128)),
        ("https_proxy", "proxy.example:3128", ("proxy.example", 3128)),  # (no scheme: http://)
        ("ALL_PROXY", "http://proxy.example", ("proxy.example", 80)),
        ("all_proxy", "https://proxy.example", ("proxy.example", 443)),
    ],
)
def test_with_a_proxy_set_the_proxy_is_probed_on_its_port(probed, monkeypatch, variable, proxy, expected):
    """A proxy from any of the four variables is what is probed: its host, its port or its scheme's (a proxy given
    without a scheme is an http one, on port 80 unless it names one), with the timeout given."""
    monkeypatch.setenv(variable, proxy)
    assert hub.hub_reachable(timeout=0.75) is True
    assert probed == [(*expected, 0.75)]
    monkeypatch.setenv("NO_PROXY", "huggingface.co")  # (the hub bypasses the proxy: the hub itself is probed)
    probed.clear()
    assert hub.hub_reachable(timeout=0.75) is True
    assert probed == [("huggingface.co", 443, 0.75)]


def test_the_proxy_probed_is_the_one_the_hub_libraries_use(probed, monkeypatch):
    """The proxy is read as the hub libraries read it (``urllib.request.getproxies``): the lower-case variable wins
    over the upper-case one (the probe tried HTTPS_PROXY's while the libraries went through https_proxy's), and an
    ``http://`` endpoint goes through HTTP_PROXY, not HTTPS_PROXY (a mirror on the local network, reached directly,
    was called down when the internet proxy was)."""
    monkeypatch.setenv("HTTPS_PROXY", "http://upper.example:1111")
    monkeypatch.setenv("https_proxy", "http://lower.example:2222")
    assert hub.hub_reachable(timeout=1.0) is True
    assert probed == [("lower.example", 2222, 1.0)]
    probed.clear()
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.example:8080")
    assert hub.hub_reachable(timeout=1.0) is True
    assert probed == [("mirror.example", 8080, 1.0)]
    probed.clear()
    monkeypatch.setenv("http_proxy", "plain.example:3333")
    assert hub.hub_reachable(timeout=1.0) is True
    assert probed == [("plain.example", 3333, 1.0)]


def test_the_probe_answers_what_the_connection_did(monkeypatch):
    """hub_reachable is False when the connection fails (nothing listens on the port) and passes its timeout on to
    the socket (a probe without one waited for the system's TCP timeout)."""
    import socket

    for name in PROXIES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert hub.hub_reachable(timeout=0.5) is False
    seen: list[object] = []

    class Conn:
        def close(self) -> None:
            pass

    def create_connection(address, timeout=None):
        seen.append((address, timeout))
        return Conn()

    monkeypatch.setattr(socket, "create_connection", create_connection)
    assert hub.hub_reachable(timeout=0.5) is True
    assert seen == [(("127.0.0.1", 9), 0.5)]


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "True", "yes", "on", " 1 ", "ON\n"])
def test_offline_values_that_turn_it_on(monkeypatch, value):
    """HF_HUB_OFFLINE (the default variable) set to 1/true/yes/on, in any case and with spaces around, is offline
    mode; the variable itself is what offline_variable names."""
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert hub.offline_requested() is True
    assert hub.offline_variable() == "HF_HUB_OFFLINE"


@pytest.mark.parametrize("value", ["", "0", "false", "no", "off", "2", "offline"])
def test_offline_values_that_leave_it_off(monkeypatch, value):
    """Any other value (empty, 0, false, no, off, anything else) is not offline mode."""
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert hub.offline_requested() is False
    assert hub.offline_variable() is None


def test_offline_variable_names_the_first_variable_set_of_those_asked(monkeypatch):
    """With names given, only those are read (the default HF_HUB_OFFLINE then is not), in their order."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    assert hub.offline_variable("HF_DATASETS_OFFLINE") is None
    assert hub.offline_requested("HF_DATASETS_OFFLINE") is False
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "yes")
    assert hub.offline_variable("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE") == "HF_DATASETS_OFFLINE"
    assert hub.offline_variable("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") == "HF_HUB_OFFLINE"


@pytest.mark.parametrize(
    ("endpoint", "fix"),
    [
        ("hf-mirror.example", "set it to https://hf-mirror.example"),
        ("hf-mirror.example:8080/", "set it to https://hf-mirror.example:8080"),
        ("ftp://hf-mirror.example", "set it to https://hf-mirror.example"),
        ("", "unset it for huggingface.co"),
    ],
)
def test_an_endpoint_that_is_not_a_url_is_an_error_naming_it(probed, monkeypatch, endpoint, fix):
    """An HF_ENDPOINT without http:// or https:// (or empty) is EndpointError naming the value and the fix: the hub
    libraries prefix their requests with it as written, and the probe tried huggingface.co instead (nothing is
    probed now)."""
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    with pytest.raises(
        hub.EndpointError, match=rf"^HF_ENDPOINT='{endpoint}' is not an http:// or https:// URL .*: {fix}$"
    ):
        hub.hub_reachable()
    assert probed == []


def test_an_endpoint_that_is_not_a_url_is_one_data_or_checkpoint_line(probed, monkeypatch, tmp_path):
    """What reads from the hub says so in its own error type (DataError for a dataset, CheckpointError for a model:
    the lines the command line prints), not a ValueError from the probe."""
    import huggingface_hub

    from dgrpo.data import loaders
    from dgrpo.data.records import DataError
    from dgrpo.model.factory import CheckpointError
    from dgrpo.model.sources import resolve_hub_model

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "DGRPO_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "hf-mirror.example")
    monkeypatch.chdir(tmp_path)  # (no ./data)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setitem(__import__("sys").modules, "datasets", __import__("types").SimpleNamespace())
    with pytest.raises(CheckpointError, match=r"^model 'org/name': HF_ENDPOINT='hf-mirror.example' is not an "):
        resolve_hub_model("org/name")
    with pytest.raises(DataError, match=r"hub could not be reached: HF_ENDPOINT='hf-mirror.example' is not an "):
        loaders.load_dataset("org/data", "test")
    with pytest.raises(DataError, match=r"could not be reached: HF_ENDPOINT='hf-mirror.example' is not an http"):
        loaders.load_dataset("openmathinstruct2_gsm", "train")
    assert probed == []


def test_within_one_probe_each_address_is_probed_once(probed, monkeypatch):
    """Within :func:`hub.one_probe` an address probed before answers as it first did, unreachable or reachable,
    without a second connection; another address (a proxy set in between) is probed; outside it (before, after, a
    new one) every call probes."""
    answers = iter([True, False, True, True, False])
    monkeypatch.setattr(hub, "_connects", lambda host, port, timeout: probed.append((host, port)) or next(answers))
    hub_443 = ("huggingface.co", 443)
    assert hub.hub_reachable() is True  # (outside: each call probes)
    with hub.one_probe():
        assert [hub.hub_reachable(), hub.hub_reachable(timeout=0.1)] == [False, False]
        monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
        assert [hub.hub_reachable(), hub.hub_reachable()] == [True, True]
        monkeypatch.delenv("HTTPS_PROXY")
        assert hub.hub_reachable() is False  # (the hub's first answer)
    assert probed == [hub_443, hub_443, ("proxy.example", 3128)]
    assert hub.hub_reachable() is True
    with hub.one_probe():
        assert [hub.hub_reachable(), hub.hub_reachable()] == [False, False]
    assert probed[3:] == [hub_443, hub_443]
