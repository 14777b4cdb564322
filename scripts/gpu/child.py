"""A child process of a check, driven by lines: the check reads its stdout lines (waiting for
one that starts with a token) and writes lines to its stdin.
"""

import os
import select
import subprocess
import time

from verdicts import fail, info


class Child:
    """A child process driven by lines: we read its stdout lines, write its stdin.
    Reads the pipe with os.read and splits lines itself, so that select() never waits
    on a line already buffered."""

    def __init__(self, cmd, timeout, **popen):
        info("starting: " + " ".join(cmd))
        self.timeout = timeout
        self.buf = b""
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, **popen)
        self.fd = self.p.stdout.fileno()

    def readline(self, deadline):
        """The next line (with its newline), "" at EOF, None at the deadline."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self.fd], [], [], left)
            if not r:
                continue
            chunk = os.read(self.fd, 65536)
            if not chunk:
                rest, self.buf = self.buf, b""
                return rest.decode(errors="replace")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode(errors="replace") + "\n"

    def expect(self, token):
        """Waits for a stdout line starting with token; returns the rest of the line.
        Lines before it are echoed; a FAIL line from the child ends the probe."""
        deadline = time.monotonic() + self.timeout
        while True:
            line = self.readline(deadline)
            if line is None:
                self.kill()
                fail("child: no '%s' line within %d s" % (token, self.timeout))
            if line == "":
                rc = self.p.wait()
                fail("child exited (status %s) before printing '%s'" % (rc, token))
            line = line.rstrip("\n")
            if line.startswith(token):
                return line[len(token):].strip()
            print("  child| " + line, flush=True)
            if line.startswith("FAIL: "):
                self.kill()
                fail("child: " + line[6:])

    def send(self, line):
        try:
            self.p.stdin.write((line + "\n").encode())
            self.p.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def finish(self):
        """Closes its stdin, echoes the rest of its output, returns its exit status
        (None if it had to be killed)."""
        try:
            self.p.stdin.close()
        except (BrokenPipeError, ValueError):
            pass
        deadline = time.monotonic() + self.timeout
        while True:
            line = self.readline(deadline)
            if line is None:
                self.kill()
                return None
            if line == "":
                break
            print("  child| " + line.rstrip("\n"), flush=True)
        try:
            return self.p.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
