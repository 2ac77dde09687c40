"""Stack Exchange site names. Everywhere in the project a site is named by its host
(`beer.stackexchange.com`, `stackoverflow.com`, `pt.stackoverflow.com`): the split of a question hashes
(site, question id), so a question must get the same site name from a dump, the API and a page.
"""

from __future__ import annotations

import re

# api_site_parameter of the sites whose host is not <name>.stackexchange.com
_OWN_DOMAINS = {
    "stackoverflow": "stackoverflow.com",
    "superuser": "superuser.com",
    "serverfault": "serverfault.com",
    "askubuntu": "askubuntu.com",
    "mathoverflow": "mathoverflow.net",
    "stackapps": "stackapps.com",
}


_SITE_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")


def is_site_name(name: str) -> bool:
    """Whether `name` can name a site ('beer', 'pt.stackoverflow', 'beer.stackexchange.com'): a host name's
    letters, digits, hyphens and dots, nothing a request or a file name would mangle ('cof fee', 'beer/')."""
    return _SITE_NAME.fullmatch(name.strip().lower()) is not None


def check_site_names(option: str, names: list[str]) -> None:
    """Raise UsageError naming `option` and the first of `names` that is no site name."""
    from runtime.checks import UsageError

    wrong = [name for name in names if not is_site_name(name)]
    if wrong:
        raise UsageError(
            f"{option}: {wrong[0]!r} is not a site name (a host's letters, digits, hyphens and dots: beer, "
            "pt.stackoverflow, beer.stackexchange.com)"
        )


def site_host(name: str) -> str:
    """Sites are named by host everywhere: 'beer' -> 'beer.stackexchange.com', 'stackoverflow' ->
    'stackoverflow.com', 'pt.stackoverflow' -> 'pt.stackoverflow.com'; hosts pass through."""
    name = name.strip().lower()
    if name.endswith((".com", ".net")):
        return name
    head, _, lang = name.partition(".")  # 'pt.stackoverflow' style
    if lang and lang in _OWN_DOMAINS:
        return f"{head}.{_OWN_DOMAINS[lang]}"
    return _OWN_DOMAINS.get(name, f"{name}.stackexchange.com")


def api_site(host: str) -> str:
    """The API's `site` parameter for a host: 'beer.stackexchange.com' -> 'beer'."""
    host = site_host(host)
    for short, domain in _OWN_DOMAINS.items():
        if host == domain:
            return short
        if host.endswith("." + domain):
            return f"{host[: -len(domain) - 1]}.{short}"
    return host[: -len(".stackexchange.com")] if host.endswith(".stackexchange.com") else host
