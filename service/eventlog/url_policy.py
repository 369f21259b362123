"""Where a webhook may post: http or https to a public address. Loopback, link-local
(the cloud metadata address 169.254.169.254 among them), private, shared, reserved and
multicast targets, and IPv6 addresses that embed one (IPv4-mapped, 6to4, Teredo), are refused unless the operator sets RAYDOCK_WEBHOOK_ALLOW_PRIVATE, so
a webhook cannot become a way into the server's own network. The URL is checked at
submit (a literal address or a ``localhost`` name) and the name's resolved addresses
again before every post (a public name can point anywhere), which then connects to the
address checked; redirects are never followed."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from api.errors import InvalidSpec

CODE = "webhook_url_refused"
ALLOW_SETTING = "RAYDOCK_WEBHOOK_ALLOW_PRIVATE"


def refused(where: str, url: str, why: str) -> InvalidSpec:
    return InvalidSpec(
        f"{where}: {url[:200]!r} is refused: {why}. Give an http(s) URL of a public address"
        f" (the server's operator can allow private targets with {ALLOW_SETTING}=1).",
        code=CODE,
        details=[{"loc": where, "msg": why, "type": CODE}],
    )


def address_problem(address: str) -> str | None:
    """Why an IP address is no webhook target (None: a public address)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        else:  # 6to4 and Teredo carry an IPv4 address a relay delivers to: it is checked as one
            for embedded in (ip.sixtofour, *(ip.teredo or ())):
                if embedded is not None and (problem := address_problem(str(embedded))):
                    return f"{problem}, embedded in {ip}"
    for kind in ("loopback", "link_local", "unspecified", "multicast", "private", "reserved"):
        if getattr(ip, f"is_{kind}"):
            return f"it is a {kind.replace('_', '-')} address ({ip})"
    if not ip.is_global:
        return f"it is not a public address ({ip})"
    return None


def literal_address(host: str) -> str | None:
    """The IP address ``host`` spells, including IPv4's short forms (``127.1``, ``0x7f.1``)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return socket.inet_ntoa(socket.inet_aton(host))
    except (OSError, UnicodeError):
        return None


def check_url(url: str, *, allow_private: bool, where: str = "url") -> tuple[str, str, int]:
    """Scheme, host and port of a webhook URL, or InvalidSpec (422 ``webhook_url_refused``)."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise refused(where, url, f"it is not a valid URL ({exc})") from None
    host = (parts.hostname or "").rstrip(".").lower()
    if parts.scheme not in ("http", "https"):
        raise refused(where, url, "only http and https are allowed")
    if not host:
        raise refused(where, url, "it names no host")
    if parts.username is not None or parts.password is not None:
        raise refused(where, url, "it carries credentials; put a token in the path or rely on the signature")
    if allow_private:
        return parts.scheme, host, port
    if host == "localhost" or host.endswith(".localhost"):
        raise refused(where, url, "it is a loopback name")
    address = literal_address(host)
    if address is not None and (problem := address_problem(address)):
        raise refused(where, url, problem)
    return parts.scheme, host, port


def resolve(host: str, port: int, *, allow_private: bool) -> tuple[str | None, str | None]:
    """At send time: (an address of ``host`` to connect to, None) when every address it
    resolves to is a target, else (None, why not). The post goes to that address, so a
    name cannot resolve to a public address for the check and a private one for the post."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return None, f"{host} does not resolve ({exc})"
    if not infos:
        return None, f"{host} does not resolve"
    for info in infos:
        if not allow_private and (problem := address_problem(info[4][0])):
            return None, f"{host} resolves to a refused address: {problem}"
    return str(infos[0][4][0]).split("%", 1)[0], None
