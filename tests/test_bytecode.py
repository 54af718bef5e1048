"""kernalin_ci/bytecode.py: where the installation already holds its bytecode, nothing is compiled and
workers read it there; where it does not (an image installed without .pyc files), the parent compiles a
worker's imports once into its own cache (the sandboxed worker side: tests/hostile/test_worker_sandbox.py)."""

import py_compile
import sys

from kernalin_ci import bytecode


def test_an_installation_without_bytecode_is_seen(tmp_path, monkeypatch):
    pkg = tmp_path / "kbfake"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(bytecode, "SAMPLE", (("kbfake", ("__init__.py",)),))
    monkeypatch.setattr(bytecode, "_ready", {})
    monkeypatch.delenv(bytecode.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert not bytecode.installed_bytecode()
    py_compile.compile(str(pkg / "__init__.py"), doraise=True)  # what pip does on install
    assert bytecode.installed_bytecode()
    assert bytecode.worker_prefix() is None and not (tmp_path / "cache").exists()  # nothing to do


def test_the_key_names_this_python(monkeypatch):
    key = bytecode.installation_key()
    monkeypatch.setattr(sys, "version", sys.version + " (another build)")
    assert bytecode.installation_key() != key


def test_a_compiled_cache_on_a_read_only_file_system_is_used_as_it_is(tmp_path, monkeypatch):
    import errno
    import os

    cache = tmp_path / "bytecode"
    cache.mkdir()
    (cache / f".ready-{bytecode.installation_key()}").write_text("")

    def read_only(*a, **k):  # a cache bound read-only (a shared one, made beforehand): nothing can change it
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "chmod", read_only)
    monkeypatch.setattr(os, "makedirs", read_only)
    monkeypatch.setenv(bytecode.ENV, str(cache))
    monkeypatch.setattr(bytecode, "_ready", {})
    assert bytecode.worker_prefix() == str(cache)


def test_the_compiling_child_imports_nothing_from_a_folder_on_our_path(tmp_path, monkeypatch):
    """The child that compiles the cache runs outside the sandbox: a folder on this process's sys.path
    (a checkout on PYTHONPATH) must not give it a `numpy` of its own; it imports from the installation."""
    shadow = tmp_path / "checkout"
    shadow.mkdir()
    marker = tmp_path / "ran"
    (shadow / "numpy.py").write_text(f"open({str(marker)!r}, 'w').write('shadow numpy ran')\n")
    monkeypatch.syspath_prepend(str(shadow))
    monkeypatch.setenv(bytecode.ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(bytecode, "_ready", {})
    assert bytecode.worker_prefix() == str(tmp_path / "cache")
    assert not marker.exists()
