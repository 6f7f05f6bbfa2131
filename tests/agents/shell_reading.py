"""Reading a shell's terminal in tests: until a marker appears or the output ends, bounded."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from agents.runtime.shell import ShellProcess

READ_TIMEOUT_S = 20.0


async def read_until(shell: ShellProcess, marker: bytes | None) -> bytes:
    """What the terminal writes until ``marker`` appears (None: until the output ends)."""
    output = b""

    async def collect() -> None:
        nonlocal output
        while marker is None or marker not in output:
            data = await shell.read()
            if not data:
                if marker is not None:
                    raise AssertionError(f"output ended before {marker!r}: {output!r}")
                return
            output += data

    try:
        await asyncio.wait_for(collect(), READ_TIMEOUT_S)
    except TimeoutError:
        raise AssertionError(f"no {marker!r} within {READ_TIMEOUT_S:g}s: {output!r}") from None
    return output


async def closed(shell: ShellProcess) -> int | None:
    """Close the shell; fail instead of hanging when it never ends (the bound is not a timing
    assertion)."""
    try:
        return await asyncio.wait_for(shell.close(), 30)
    except TimeoutError:
        raise AssertionError("the shell did not end within 30s of its close") from None


async def run_in(shell: ShellProcess, command: str) -> list[str]:
    """Type ``command`` and return the lines it printed. The markers around them are computed
    by the shell, so neither the terminal's echo of the typed line nor a prompt matches them."""
    await shell.write(f"echo BEGIN-$((6*7)); {command}; echo END-$((6*7))\r".encode())
    lines = (await read_until(shell, b"END-42\r\n")).decode().split("\r\n")
    begin = next(index for index, line in enumerate(lines) if line.endswith("BEGIN-42"))
    end = next(index for index, line in enumerate(lines) if line.endswith("END-42"))
    return lines[begin + 1 : end]


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, which only waits to be reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
