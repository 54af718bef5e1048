"""The PR gate: git diff -> changed kernels -> verify + bench -> Report."""
