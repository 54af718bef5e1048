"""What the ops, the verifier and the benchmark all run on, below all of them: poisoning
(`poison.py`), the Triton interpreter patches (`interp_patches.py`, `interp_bf16.py`), CUDA error
recognition (`cuda_errors.py`) and row comparison (`rows.py`). It imports nothing of kernalin_ci
but `lazy` (tests/test_layers.py)."""
