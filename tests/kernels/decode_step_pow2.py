"""A correct fused decode step that, like most production kernels, takes only power-of-two head dims:
the catalogue's fully fused kernel (checks/decode_step/correct_fused.py) behind a launcher that refuses
any other D, as serving stacks' launchers do (`assert head_dim in (64, 128, 256)`)."""
import importlib.util
from pathlib import Path

_path = Path(__file__).resolve().parents[2] / "checks" / "decode_step" / "correct_fused.py"
_spec = importlib.util.spec_from_file_location("_decode_step_correct_fused", _path)
_fused = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fused)


def entry(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale):
    D = q.shape[-1]
    assert D & (D - 1) == 0, f"head_dim {D} is not supported (a power of two is required)"
    return _fused.entry(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale)
