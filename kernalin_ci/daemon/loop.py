"""BackgroundLoop: a daemon thread that runs `_loop()` until `stop()`.

The poster and the RQ dispatcher are both one; `_loop()` waits on `wake` between passes,
so `wake.set()` makes a pass happen now and `stop()` ends the loop promptly.
"""

from __future__ import annotations

import threading


class BackgroundLoop:
    thread_name = "kernalin-loop"

    def __init__(self) -> None:
        self.wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self):
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.wake.set()
        if self._thread:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        raise NotImplementedError
