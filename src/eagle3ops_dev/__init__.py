"""The eagle3ops development harness: the embedded sandbox host, the demo, the stand-in base builder, the trained
stand-in target, and the demo's real target the tests and benchmarks run on.

Never shipped in the ``eagle3ops`` wheel (``[tool.setuptools.packages.find]`` includes ``eagle3ops`` only), never
in an image (the pipeline image's build context holds ``src/eagle3ops`` only) and never imported by it
(import-linter contract in pyproject.toml and an AST scan, both in tests/test_contracts.py). It imports the product
freely; the tiny models the behavioural probes build are product (:mod:`eagle3ops.fixtures`), and the harness uses
them from there. Where it is importable:

- the driver venv: ``scripts/setup.sh`` writes ``eagle3ops-dev.pth`` (this checkout's ``src``) into its site dir;
  ``python -m eagle3ops_dev ...`` is its command line;
- a container of the pipeline image that runs a harness module (the SmolLM2 target's build, ``tests/image``):
  this checkout's ``src/eagle3ops_dev`` mounted read-only and put on ``PYTHONPATH``
  (:func:`eagle3ops_dev.provision.harness_in_container`, ``scripts/test-image.sh``).

Modules: :mod:`.tinytrained` (the trained, deepened stand-in target); :mod:`.sandbox` (the sandbox host);
:mod:`.demo`, :mod:`.provision` (the demo and its target's build argv); :mod:`.smollm2` (the demo's real target,
SmolLM2-135M-Instruct from a hash-pinned wheel; not a stand-in); :mod:`.bases` (the stand-in bases);
:mod:`.headspecs` (container specs of the trained-head serving test); :mod:`.gatesim`, :mod:`.gpuhead` (the pure
parts of the gate simulation and of the GPU head's serving benchmark, imported by the lab and the tests alike);
:mod:`.cli` (``python -m eagle3ops_dev``).
"""
