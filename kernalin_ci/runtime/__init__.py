"""What the ops, the verifier and the benchmark all run on, below all of them: poisoning
(`poison.py`) and the Triton interpreter patches (`interp_patches.py`, `interp_bf16.py`)."""
