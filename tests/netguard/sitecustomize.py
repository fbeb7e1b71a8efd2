"""Loopback guard for the SageMaker tests: a connection or name lookup for anything but loopback
fails (ConnectionRefusedError) and is recorded (LLMPIPE_NETGUARD_LOG, one line per attempt).

Loaded in-process by tests/test_sagemaker.py (install / uninstall) and, as sitecustomize through
PYTHONPATH, in every Python process of the Snakemake run it starts."""

from __future__ import annotations

import ipaddress
import os
import socket

_ORIGINAL = {}
LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def _is_local(host) -> bool:
    if host is None:
        return True
    host = host.decode() if isinstance(host, bytes) else str(host)
    if host.lower() in LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _refuse(what: str):
    path = os.environ.get("LLMPIPE_NETGUARD_LOG")
    if path:
        with open(path, "a") as fh:
            fh.write(f"{os.getpid()} {what}\n")
    raise ConnectionRefusedError(f"loopback guard: {what} refused (these tests never leave loopback)")


def install() -> None:
    if _ORIGINAL:
        return
    _ORIGINAL.update(connect=socket.socket.connect, connect_ex=socket.socket.connect_ex, getaddrinfo=socket.getaddrinfo)

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(address[0]):
            _refuse(f"connect to {address[0]}:{address[1]}")
        return _ORIGINAL["connect"](self, address)

    def connect_ex(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(address[0]):
            _refuse(f"connect to {address[0]}:{address[1]}")
        return _ORIGINAL["connect_ex"](self, address)

    def getaddrinfo(host, *args, **kwargs):
        if not _is_local(host):
            _refuse(f"name lookup of {host}")
        return _ORIGINAL["getaddrinfo"](host, *args, **kwargs)

    socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo


def uninstall() -> None:
    if _ORIGINAL:
        socket.socket.connect = _ORIGINAL.pop("connect")
        socket.socket.connect_ex = _ORIGINAL.pop("connect_ex")
        socket.getaddrinfo = _ORIGINAL.pop("getaddrinfo")


if os.environ.get("LLMPIPE_NETGUARD_LOG"):
    install()
