"""One bounded HTTP GET for everything decodebench reads from a server beside its requests (the model listing,
``/metrics``, a DCGM exporter).

What a server sends is untrusted: a page that trickles in one byte at a time must not hold a run past its deadline
(a socket timeout alone restarts at every byte), a page without end must not fill the memory, and a redirect to
another host must not take the API key there. ``get`` bounds the whole read in size (``max_bytes``) and time (the
deadline ``timeout_s`` is checked after each read, and one read waits at most ``timeout_s``: at most twice it in all),
follows redirects only on the same host, and raises ``OSError`` naming the URL and what went wrong.
"""

from __future__ import annotations

import time
import urllib.request
from urllib.parse import urlparse

MAX_BYTES = 16 * 2**20  # vLLM's /metrics is ~100 KB; a DCGM exporter's a few MB on eight GPUs
CHUNK = 64 * 2**10


class _SameHostRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urlparse(newurl).netloc != urlparse(req.full_url).netloc:
            raise OSError(f"{req.full_url} redirects to another host ({newurl}); not followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_opener = urllib.request.build_opener(_SameHostRedirects)


def get(url: str, headers: dict[str, str] | None = None, timeout_s: float = 10.0, max_bytes: int = MAX_BYTES) -> bytes:
    """The body of ``url``, read within ``timeout_s`` seconds in all and at most ``max_bytes`` long."""
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(url, headers=headers or {})
    with _opener.open(request, timeout=timeout_s) as response:
        body = bytearray()
        while chunk := response.read1(CHUNK):
            body += chunk
            if len(body) > max_bytes:
                raise OSError(f"{url} sent more than {max_bytes} bytes; read stopped there")
            if time.monotonic() > deadline:
                raise OSError(f"{url} took more than {timeout_s:g} s to send its page; read stopped there")
        return bytes(body)
