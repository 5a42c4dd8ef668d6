"""
Model files and training checkpoints: tensors and JSON only, loaded with
``torch.load(weights_only=True)`` so that opening a file never runs code from
it.  A SHA-256 checksum over the configuration and every tensor detects
truncated, damaged or hand-edited files; it is not a signature (no key), so it
does not authenticate the author.
"""

import hashlib
import json
import os
import re
import socket
import time
import uuid
from typing import NamedTuple

import torch

from pyro_sparse.version import __version__


class FileFormat(NamedTuple):
    """The format tag and version written into a file, and what to call it in errors."""

    name: str
    version: int
    description: str


MODEL_FILE = FileFormat("pyro_sparse.model", 1, "pyro_sparse model file")


class ModelFileError(ValueError):
    """A model file that is unreadable, corrupt, altered or of another format."""


def _well_formed(config_json, states):
    """The layout :func:`write` gives: JSON text, and part name -> {key: tensor}."""
    return isinstance(config_json, str) and isinstance(states, dict) and all(
        isinstance(part, str) and isinstance(state, dict)
        and all(isinstance(k, str) and torch.is_tensor(v) and v.layout == torch.strided for k, v in state.items())
        for part, state in states.items()
    )


def _checksum(config_json, states):
    digest = hashlib.sha256(config_json.encode())
    for part in sorted(states):
        for key in sorted(states[part]):
            tensor = states[part][key].detach().cpu().contiguous()
            digest.update(f"{part}/{key}/{tensor.dtype}/{tuple(tensor.shape)}".encode())
            digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def _temporary_beside(path):
    """
    ``(handle, name)`` of a new file in ``path``'s folder (made if missing), to
    be renamed to ``path``.  Created with the mode of a plain new file (0666
    less the umask), not mkstemp's private 0600, which the rename would keep.
    Its name carries this machine and process, so that the partial files of
    writers killed before their rename are removed here.
    """
    path = os.fsdecode(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path!r} is a folder; give the name of a file to write")
    directory = os.path.dirname(os.path.abspath(path))
    prefix = f".{os.path.basename(path)}.{socket.gethostname()}."
    try:
        os.makedirs(directory, exist_ok=True)
        if os.name == "posix":  # elsewhere os.kill(pid, 0) is not a harmless probe
            _remove_orphans(directory, prefix)
        temporary = os.path.join(directory, f"{prefix}{os.getpid()}.{uuid.uuid4().hex}.partial")
        return os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), temporary
    except OSError as error:
        raise type(error)(error.errno, f"cannot write {path!r}: {error.strerror}", error.filename) from None


# A partial file older than this whose writer is gone is an orphan; a younger one may belong to a writer in
# another process namespace (a container sharing the folder and host name), whose pid this one cannot see.
ORPHAN_AGE_SECONDS = 3600.0


def _remove_orphans(directory, prefix):
    """
    Partial files of ``prefix`` (a target on this machine) that this user
    wrote, untouched for ``ORPHAN_AGE_SECONDS``, whose writing process no
    longer runs.  Best effort: a file that cannot be removed is left.
    """
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.[0-9a-f]{32}\.partial")
    try:
        names = os.listdir(directory)
    except OSError:  # a folder one may write but not list
        return
    for name in names:
        match = pattern.fullmatch(name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        path = os.path.join(directory, name)
        try:
            status = os.stat(path)
            if status.st_uid != os.getuid() or time.time() - status.st_mtime < ORPHAN_AGE_SECONDS:
                continue
            os.kill(int(match.group(1)), 0)  # no signal: only whether the process exists
        except ProcessLookupError:
            try:
                os.unlink(path)
            except OSError:
                pass
        except OSError:  # gone already, or the process runs as another user
            pass


def _fspath(path):
    """``path`` as a str; a TypeError naming it if it is not a path."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"a file path is a str or os.PathLike, got {path!r}")
    return os.fsdecode(path)


def _target(path):
    """Where writing ``path`` goes: a str path, through any symbolic link."""
    return os.path.realpath(_fspath(path))


def check_writable(path):
    """Raise now, before any training, if a file cannot be written at ``path``."""
    handle, temporary = _temporary_beside(_target(path))
    os.close(handle)
    os.unlink(temporary)


def write(path, config, states, file_format=MODEL_FILE):
    """
    Write ``config`` (JSON-able dict) and ``states`` (name -> state dict)
    atomically: a crash mid-write leaves any previous file at ``path`` intact.
    A symbolic link at ``path`` is kept and its target replaced.
    """
    path = _target(path)
    config_json = json.dumps(config, sort_keys=True)
    states = {part: {k: v.detach().cpu() for k, v in state.items()} for part, state in states.items()}
    payload = {
        "format": file_format.name,
        "format_version": file_format.version,
        "library_version": __version__,
        "config_json": config_json,
        "states": states,
        "checksum": _checksum(config_json, states),
    }
    handle, temporary = _temporary_beside(path)
    try:
        with os.fdopen(handle, "wb") as stream:
            torch.save(payload, stream)
            stream.flush()
            os.fsync(stream.fileno())
        if os.path.exists(path):
            os.chmod(temporary, os.stat(path).st_mode & 0o777)  # a replaced file keeps its mode
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def read(path, file_format=MODEL_FILE):
    """The ``(config, states)`` written by :func:`write`, after every check."""
    path = _fspath(path)
    name, version, description = file_format
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no {description} at {path!r}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for bad or unsafe files
        raise ModelFileError(
            f"{path!r} is not a readable {description} (it may be truncated, "
            f"corrupt, or contain objects other than tensors, which are refused): {error}"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != name:
        raise ModelFileError(f"{path!r} is not a {description}")
    if payload.get("format_version") != version:
        raise ModelFileError(
            f"{path!r} has {description} format version {payload.get('format_version')!r}, this library "
            f"reads version {version}; load it with pyro_sparse {payload.get('library_version')} and refit"
        )
    config_json, states = payload.get("config_json"), payload.get("states")
    if not (_well_formed(config_json, states) and payload.get("checksum") == _checksum(config_json, states)):
        raise ModelFileError(f"{path!r} fails its checksum: the file was altered or damaged")
    return json.loads(config_json), states
