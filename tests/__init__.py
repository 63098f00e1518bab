"""The test suite as a regular package, so ``tests.runtime_helpers`` is always this repository's.

Without this file ``tests`` is a namespace package, and any regular package named ``tests`` on
``sys.path`` wins over it wherever it sits: ROLL's requirement ``latex2sympy2`` installs one into
site-packages, and every ``from tests.<helper> import ...`` then failed in ROLL's environment.
pytest puts the repository root first on ``sys.path`` for a package of tests, so this one is found.
"""
