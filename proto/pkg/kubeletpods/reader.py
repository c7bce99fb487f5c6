"""The kubelet's `GET /pods`: the node's PodList as raw bytes, over keep-alive HTTP.

The read-only port (10255) is unauthenticated, deprecated and off by default in
newer kubelets, so the URL is a flag and every failure is a KubeletPodsError
naming the URL and the cause. Callers parse the bytes themselves.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import aiohttp

DEFAULT_KUBELET_PODS_URL = "http://127.0.0.1:10255/pods"


class KubeletPodsError(Exception):
    """The kubelet's pod list could not be read: `reason` says why, the message adds the URL."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"kubelet {url} {reason}")
        self.url = url
        self.reason = reason


def check_pods_url(url: str) -> str | None:
    """A problem with a kubelet pods URL, or None when it is usable."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return f"{url!r} must be an http:// or https:// URL, e.g. {DEFAULT_KUBELET_PODS_URL}"
    if not parts.hostname:
        return f"{url!r} has no host, e.g. {DEFAULT_KUBELET_PODS_URL}"
    try:
        parts.port  # noqa: B018 (raises ValueError on a bad port)
    except ValueError:
        return f"{url!r} has an invalid port"
    return None


def _os_reason(error: OSError) -> str:
    """The system's words for a socket error ("Connection refused"), else the error's own."""
    if error.errno is not None and error.errno > 0:
        return os.strerror(error.errno)
    return error.strerror or str(error)


class KubeletPodsReader:
    """GETs the kubelet's `/pods` over one long-lived aiohttp session (keep-alive pool).

    A URL without a path reads `/pods`. The session is made on the first `get`, inside
    the running loop; `aclose` closes it.
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        problem = check_pods_url(url)
        if problem is not None:
            raise ValueError(f"kubelet pods URL {problem}")
        self.url = url
        self.timeout_s = timeout_s
        parts = urlsplit(url)
        self._target = parts._replace(path="/pods").geturl() if not parts.path else url
        self._session: aiohttp.ClientSession | None = None

    async def get(self) -> bytes:
        """The body of `GET url`; raise KubeletPodsError unless it is a whole 200 answer."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                headers={"Accept": "application/json"},
            )
        try:
            async with self._session.get(self._target) as response:
                if response.status != 200:
                    raise KubeletPodsError(self.url, f"answered HTTP {response.status}")
                return await response.read()
        except TimeoutError as exc:
            raise KubeletPodsError(self.url, f"did not answer within {self.timeout_s:g} s") from exc
        except aiohttp.ClientConnectorError as exc:
            raise KubeletPodsError(self.url, f"not reachable: {_os_reason(exc.os_error)}") from exc
        except (aiohttp.ClientError, OSError) as exc:
            detail = str(exc) or type(exc).__name__
            raise KubeletPodsError(self.url, f"connection failed: {detail}") from exc

    async def aclose(self) -> None:
        """Close the session and its connections."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
