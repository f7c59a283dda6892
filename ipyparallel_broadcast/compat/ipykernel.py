"""The seam to ipykernel (and IPython's shell): every use of a private member
of theirs is here, each with why.

- ``InteractiveShell._showtraceback``: hidden for one request by an instance
  attribute, so that a traceback goes into the reply and not onto IOPub;
- ``InteractiveShell._last_traceback``: where ipykernel's shell keeps the
  formatted traceback that a reply carries;
- ``Kernel._main_asyncio_lock``: held while ipykernel runs a shell message; a
  broadcast apply takes the lean path only when it is free;
- ``Kernel._supports_kernel_subshells``: with subshells, shell messages take
  another route, and the lean path stays off;
- ``Kernel._aborting``: ipykernel is aborting queued requests; a broadcast
  apply then takes ipykernel's path, which aborts it;
- ``Kernel._publish_status``: the idle status that ends a request's outputs.

Checked against ipykernel 7.4.0 and IPython 9.18 (the suite).
"""

from __future__ import annotations


def lean_path_possible(kernel) -> bool:
    """This ipykernel runs shell messages under one lock, without subshells."""
    return hasattr(kernel, "_main_asyncio_lock") and not getattr(kernel, "_supports_kernel_subshells", False)


def shell_busy(kernel) -> bool:
    return kernel._main_asyncio_lock.locked()


def aborting(kernel) -> bool:
    return kernel._aborting


def publish_idle(kernel) -> None:
    kernel._publish_status("idle", "shell")


def hide_showtraceback(shell, replacement) -> None:
    shell._showtraceback = replacement  # an instance attribute hides the method


def restore_showtraceback(shell) -> None:
    del shell._showtraceback


def last_traceback(shell) -> list:
    return getattr(shell, "_last_traceback", None) or []


def set_last_traceback(shell, stb) -> None:
    shell._last_traceback = stb
