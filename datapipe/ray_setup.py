"""What datapipe's uses of Ray (backend="ray", convert --engine ray, doctor --ray, bench and train's
RAY_ADDRESS) share: Ray's import, with how to install it; joining a running cluster (`join`), probed
first so that an address where no Ray cluster answers, or one that refuses this process's token, is
one line within JOIN_TIMEOUT_S (ray.init alone retries for good); 127.0.0.1 only while a local Ray
starts (ray_local.py starts it). Light: no torch (a conversion's Ray workers import this)."""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from typing import Any

from .errors import ExpectedError, first_line, shortened
from .storage.redaction import redact


JOIN_TIMEOUT_S = 30.0  # the name resolved, the port connected and Ray's GCS answering, each within what is left
# Ray on Linux takes the machine's routable address and listens on every interface unless this is 0
# (read by Ray's processes from the environment, and by the driver's ray_constants at import)
CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK = "127.0.0.1"
TOKEN_FILE_MAX = 64 << 10  # Ray reads a token file whole, blocking: a larger one is no token (/dev/zero filled memory)
TOKEN_NOTICE = "ray._private.authentication.authentication_token_setup"  # logs "Token authentication is enabled"
FIX = "start it with `ray start --head`, or name a running head as HOST:PORT (RAY_ADDRESS, --ray-address, --ray)"
TOKEN_FIX = ("set RAY_AUTH_MODE=token and give the cluster's token in RAY_AUTH_TOKEN, in a file named by "
             "RAY_AUTH_TOKEN_PATH, or in ~/.ray/auth_token (`ray get-auth-token` on the head prints it; docs/clusters.md)")


class RayUnreachable(ExpectedError):
    """No Ray cluster this process may join answers at an address (one line: the address, the cause, the fix).
    The message is redacted where it is made: an address may carry user:password@ (ray://admin:PW@head)."""

    def __init__(self, message: str) -> None:
        super().__init__(redact(message))


def import_ray(needed_by: str = "backend='ray'") -> Any:
    """The ray module; without Ray, ImportError naming `needed_by` and how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"{needed_by} needs Ray in this process and on every node: pip install 'datapipe[ray]'") from exc
    return ray


def join(ray: Any, address: str, *, timeout_s: float = JOIN_TIMEOUT_S, **options: Any) -> None:
    """Connect this process to the running cluster at `address` ("auto": the one `ray start` runs on
    this machine; HOST:PORT; ray://HOST:PORT), as ray.init(address=...) does, once `probe` found a Ray
    cluster there that takes this process: else RayUnreachable, within `timeout_s`."""
    target = resolve(address)
    if problem := token_file_problem(turned_on=address == "auto"):
        raise RayUnreachable(f"cannot join the Ray cluster at {shown(address)}: {problem}")
    probe(target, timeout_s, auto=address == "auto", named=address)
    options = {"logging_level": logging.WARNING, "log_to_driver": False, **options}
    try:
        with quiet_token_notice():
            ray.init(address=address, **options)
    except Exception as exc:  # a version mismatch, a head that went away meanwhile
        raise RayUnreachable(f"cannot join the Ray cluster at {shown(address)}: {first_line(exc)}") from None


def resolve(address: str) -> str:
    """host:port of `address` as ray.init will dial it ('auto': the cluster `ray start` recorded here;
    127.0.0.1: the machine's address unless Ray is kept on loopback); ray:// addresses unchanged."""
    if address.startswith("ray://"):
        return address
    try:
        from ray._private.services import canonicalize_bootstrap_address, canonicalize_bootstrap_address_or_die
    except ImportError:  # Ray's private resolver gone: the address as given
        return address
    if address == "auto":
        try:
            return canonicalize_bootstrap_address_or_die("auto")
        except (ConnectionError, ValueError) as exc:
            raise RayUnreachable(f"no running Ray cluster found on this machine ({first_line(exc)}): start one "
                                 "with `ray start --head`, or give its address") from None
    split(address)  # HOST:PORT, else one line
    try:
        return canonicalize_bootstrap_address(address) or address
    except Exception:  # Ray found no address of this machine for 127.0.0.1: the probe dials what was given
        return address


def split(address: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT (ray:// and [IPv6] brackets removed); RayUnreachable when it is not one."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if "@" in host:  # shown redacted: the user:password part is not printed
        raise RayUnreachable(f"the Ray address for {shown(host.rpartition('@')[2])}:{shown(port)} carries a user or "
                             "password (not shown): a Ray address is HOST:PORT; a cluster with token authentication "
                             "takes its token from RAY_AUTH_TOKEN (docs/clusters.md)")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RayUnreachable(f"{shortened(repr(address))} is not a Ray address: give HOST:PORT, e.g. head:6379")
    return host.strip("[]"), int(port)


def shown(address: str) -> str:
    """An address for a message: as given where printable, else its repr (no terminal control characters)."""
    return shortened(address if address.isprintable() else repr(address))


def probe(target: str, timeout_s: float = JOIN_TIMEOUT_S, *, auto: bool = False, named: str | None = None) -> None:
    """The head at `target` resolved and connected to, then asked by Ray's GCS protocol whether it is
    alive (with this process's token where Ray would send one), all within `timeout_s`; else
    RayUnreachable naming the cause. ray.init alone waits forever on a dead or non-Ray address and
    retries a refused token for 20 s before a generic error. `named`: the address as the user gave it."""
    host, port = split(target)
    deadline = time.monotonic() + timeout_s
    where = f"the Ray cluster at {shown(named or target)}"
    if named not in (None, target):
        where += f" (dialled at {shown(target)})"
    addresses = _resolved(host, port, timeout_s, where)
    try:
        socket.create_connection(addresses[0], timeout=max(0.1, deadline - time.monotonic())).close()
    except TimeoutError:
        raise RayUnreachable(f"cannot join {where}: no answer in {timeout_s:g} s (a host that is down, or a "
                             f"firewall); {FIX}") from None
    except OSError as exc:
        raise RayUnreachable(f"cannot join {where}: nothing answers there ({exc.strerror or type(exc).__name__}); "
                             f"{_loopback_hint(named, target)}{FIX}") from None
    if not target.startswith("ray://"):  # Ray Client speaks its own protocol: the TCP probe is all
        _ask_gcs(target, max(0.1, deadline - time.monotonic()), where, auto)


def _loopback_hint(named: str | None, target: str) -> str:
    """Where Ray turned a loopback address into this machine's own (its rule on Linux), how to keep it."""
    if named is None or named == target or named.startswith("ray://") or named == "auto":
        return ""
    if split(named)[0] not in ("127.0.0.1", "localhost", "::1"):
        return ""
    return f"a head listening on 127.0.0.1 only is reached with {CLUSTER_SWITCH}=0 set here; "


def _resolved(host: str, port: int, timeout_s: float, where: str) -> list[tuple[str, int]]:
    """The (ip, port) of host, within timeout_s (a resolver that hangs is abandoned on its thread)."""
    found: list[Any] = []

    def lookup() -> None:
        try:
            found.append([info[4][:2] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)])
        except Exception as exc:  # OSError; ValueError for a name with a NUL in it
            found.append(exc)

    thread = threading.Thread(target=lookup, name="datapipe-ray-resolve", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not found:
        raise RayUnreachable(f"cannot join {where}: the name {shown(host)} did not resolve in {timeout_s:g} s; {FIX}")
    if isinstance(found[0], Exception) or not found[0]:
        why = getattr(found[0], "strerror", None) or (first_line(found[0]) if found[0] else "no address")
        raise RayUnreachable(f"cannot join {where}: the name {shown(host)} does not resolve ({why}); {FIX}")
    return found[0]


def _ask_gcs(target: str, timeout_s: float, where: str, auto: bool) -> None:
    """Ray's GCS CheckAlive at `target`, through Ray's own channel (its TLS and token settings)."""
    try:
        import grpc
        from ray._private.gcs_utils import create_gcs_channel
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
        from ray.exceptions import AuthenticationError
    except ImportError:  # Ray's private modules moved: ray.init finds out itself
        return
    if auto:  # ray.init(address="auto") turns token auth on where this machine has a token: the probe too
        from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available
        with quiet_token_notice():
            maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    try:
        with create_gcs_channel(target) as channel:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).CheckAlive(gcs_service_pb2.CheckAliveRequest(),
                                                                           timeout=timeout_s)
    except AuthenticationError:  # RAY_AUTH_MODE=token and no token anywhere
        raise RayUnreachable(f"cannot join {where}: RAY_AUTH_MODE=token but this process has no token; "
                             f"{TOKEN_FIX}") from None
    except grpc.RpcError as exc:
        raise RayUnreachable(_refusal(where, exc.code(), grpc.StatusCode)) from None


def _refusal(where: str, code: Any, codes: Any) -> str:
    """The one line for a GCS call that failed with gRPC status `code`."""
    if code == codes.UNAUTHENTICATED:
        from ray._private.authentication.authentication_utils import is_token_auth_enabled
        if is_token_auth_enabled():
            return (f"cannot join {where}: it refused this process's token (RAY_AUTH_TOKEN, else RAY_AUTH_TOKEN_PATH's "
                    f"file, else ~/.ray/auth_token): give the head's token (`ray get-auth-token` there prints it)")
        return f"cannot join {where}: it uses token authentication and this process sent no token; {TOKEN_FIX}"
    if code == codes.DEADLINE_EXCEEDED:
        return f"cannot join {where}: its port connects but no Ray answered in time; {FIX}"
    return (f"cannot join {where}: something answers there, but not a Ray cluster's GCS ({code.name}): give the "
            f"head's GCS port (`ray start --head --port`, 6379 by default); {FIX}")


def token_file_problem(*, turned_on: bool) -> str | None:
    """What is wrong with the token file Ray will read (RAY_AUTH_TOKEN_PATH's, else ~/.ray/auth_token,
    where RAY_AUTH_TOKEN is unset and token authentication is on: RAY_AUTH_MODE=token, or `turned_on`
    by Ray itself, for a Ray of its own or 'auto'), before Ray's loader reads it whole and blocking: a
    FIFO hung it for good, /dev/zero filled memory until the process was killed. None where it is
    absent or a small file."""
    mode = os.environ.get("RAY_AUTH_MODE", "").lower()
    if os.environ.get("RAY_AUTH_TOKEN") or mode == "disabled" or (mode != "token" and not turned_on):
        return None
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    try:
        found = os.stat(path)
    except (OSError, ValueError):  # absent (Ray says so, or makes one for a Ray of its own), a NUL in it
        return None
    if stat.S_ISREG(found.st_mode) and found.st_size <= TOKEN_FILE_MAX:
        return None
    return (f"Ray's token file {shown(path)} is not a token (a regular file of at most {TOKEN_FILE_MAX >> 10} KiB): "
            "give the token's own file in RAY_AUTH_TOKEN_PATH, or the token in RAY_AUTH_TOKEN")


@contextlib.contextmanager
def quiet_token_notice() -> Iterator[None]:
    """Ray 2.60's WARNING that token authentication is on (printed at every ray.init of a local Ray)
    kept quiet: token authentication itself stays on, as Ray's default has it."""
    logger = logging.getLogger(TOKEN_NOTICE)
    saved = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(saved)


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """While a local Ray starts: it binds and advertises 127.0.0.1 only (restored after)."""
    from ray._private import ray_constants

    saved_env, saved = os.environ.get(CLUSTER_SWITCH), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[CLUSTER_SWITCH], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
        if saved_env is None:
            os.environ.pop(CLUSTER_SWITCH, None)
        else:
            os.environ[CLUSTER_SWITCH] = saved_env
