"""`kernalin-ci tune`: verification-first optimisation (docs/tune.md).

space.py    the search space: `tune:` keyword values and/or a `@triton.autotune` config list
pin.py      worker side: discover autotune configs, load an entry pinned to one candidate
race.py     the decision code: screening (successive halving) and the per-shape judgement
run.py      the flow: verify every candidate, race the survivors, collect the result
patch.py    `--write`: the winning config as a reviewable patch to the entry's source
render.py   terminal table, tune.json, tune.md
"""
