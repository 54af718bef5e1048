"""Decode tokens per second and dollars per million output tokens (docs/tokens.md).

`spec`: the `model:` section and `--model` (shapes, presets, serving points, the GPU price);
`cost`: the arithmetic from step times to tokens/s and $/Mtok, with their posteriors;
`step`: the decode step of that shape, built with torch around the gated kernels (in the worker);
`task`: the worker task that times it, base against head, in interleaved rounds;
`bench`: the parent side (`bench_model`), which never imports the kernels under test.
"""
