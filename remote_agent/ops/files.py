"""File ops (pull: remote_agent/files/pull.py, sync: remote_agent/files/sync.py): files.list, .read, .hash, .write, .manifest, .delete."""

from typing import TYPE_CHECKING, Any, Dict

from .. import protocol as P
from ..files import pull, sync

if TYPE_CHECKING:
    from ..server import Agent


def listing(agent: "Agent", a: Dict[str, Any]) -> Any:
    return pull.list_files(str(a.get("base") or "~"), a.get("patterns"))


def read(agent: "Agent", a: Dict[str, Any]) -> Any:
    offset = P.int_arg(a, "offset", 0)
    return pull.read_range(str(a.get("path")), offset, P.int_arg(a, "max_bytes", P.FILE_CHUNK_BYTES, 0, P.FILE_CHUNK_BYTES))


def digest(agent: "Agent", a: Dict[str, Any]) -> Any:
    return pull.file_hash(str(a.get("path")))


def write(agent: "Agent", a: Dict[str, Any]) -> Any:
    return sync.write_file(agent.jobs.state_dir, a)


def manifest(agent: "Agent", a: Dict[str, Any]) -> Any:
    return sync.manifest_page(agent.jobs.state_dir, a)


def delete(agent: "Agent", a: Dict[str, Any]) -> Any:
    return sync.delete_files(agent.jobs.state_dir, a)


HANDLERS = {
    P.OP_FILES_LIST: listing, P.OP_FILES_READ: read, P.OP_FILES_HASH: digest, P.OP_FILES_WRITE: write,
    P.OP_FILES_MANIFEST: manifest, P.OP_FILES_DELETE: delete,
}
