"""The eagle3ops development harness: the embedded sandbox host, the demo, the stand-in base builder and the tiny
models (random and trained stand-in targets, random EAGLE-3 heads), and the demo's real target the tests, benchmarks and behavioural probes run on.

Never shipped in the ``eagle3ops`` wheel (``[tool.setuptools.packages.find]`` includes ``eagle3ops`` only) and never
imported by it (import-linter contract in pyproject.toml, checked by tests/test_contracts.py). It imports the
product freely. Where it is importable:

- the driver venv: ``scripts/setup.sh`` writes ``eagle3ops-dev.pth`` (this checkout's ``src``) into its site dir;
  ``python -m eagle3ops_dev ...`` is its command line;
- the pipeline image: the Dockerfile copies this package to ``/opt/eagle3ops/dev`` and puts that directory on the
  image interpreter's path with a ``.pth`` file, because the image's behavioural probes build their tiny models
  with it -- through the one seam :mod:`eagle3ops.patches.fixtures`, which loads :mod:`eagle3ops_dev.fixtures` by
  name.

Modules: :mod:`.tinymodel`, :mod:`.tinykimi` (its remote-code files under ``remote_code/``), :mod:`.tinytrained`,
:mod:`.tinydraft`, :mod:`.words` (the tiny models); :mod:`.fixtures` (what the probes build, behind the seam);
:mod:`.sandbox` (the sandbox host); :mod:`.demo`, :mod:`.provision` (the demo and its target's build argv);
:mod:`.smollm2` (the demo's real target, SmolLM2-135M-Instruct from a hash-pinned wheel; not a stand-in);
:mod:`.bases` (the stand-in bases); :mod:`.headspecs` (container specs of the trained-head serving test);
:mod:`.cli` (``python -m eagle3ops_dev``).
"""
