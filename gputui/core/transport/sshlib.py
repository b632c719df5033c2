"""asyncssh, imported without its slow search for optional C libraries.

At import asyncssh looks for liboqs (post-quantum key exchange) and nettle (UMAC) with
``ctypes.util.find_library``, which on Linux reads ``ldconfig -p`` and, for a name not there, runs ``gcc`` and
then ``ld`` too: ~45 ms per missing name here, and liboqs is looked for under two names, at every start of a
command that uses SSH. While asyncssh imports, the search reads only the dynamic loader's cache
(``ldconfig -p``): what ``dlopen`` finds by name. With ``LD_LIBRARY_PATH`` set, or off Linux, it is left as is.
The rest of gputui takes asyncssh from here (``from gputui.core.transport.sshlib import asyncssh``): no module
imports it on its own, so none can load it the slow way first (tests/test_hygiene.py holds that).

cryptography 51 deprecates DSA and warns each time asyncssh names a DSA type, which asyncssh does at import: a
user would see five lines of CryptographyDeprecationWarning on stderr at every command. Those warnings, raised
from asyncssh's own modules, are ignored here (gputui never offers a DSA key of its own).
"""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import sys
import warnings
from collections.abc import Iterator

from cryptography.utils import CryptographyDeprecationWarning


@contextlib.contextmanager
def loader_cache_only() -> Iterator[None]:
    """``ctypes.util.find_library`` reads only the loader's cache within this block (see the module)."""
    cached = getattr(ctypes.util, "_findSoname_ldconfig", None)
    if not sys.platform.startswith("linux") or cached is None or os.environ.get("LD_LIBRARY_PATH"):
        yield
        return
    original = ctypes.util.find_library
    ctypes.util.find_library = cached
    try:
        yield
    finally:
        ctypes.util.find_library = original


warnings.filterwarnings("ignore", category=CryptographyDeprecationWarning, module=r"asyncssh(\.|$)")

with loader_cache_only():
    import asyncssh as asyncssh  # noqa: E402 - re-exported
    import asyncssh.config  # noqa: E402, F401 - used by transport/ssh_config.py
    import asyncssh.encryption  # noqa: E402, F401 - used by transport/ssh.py
