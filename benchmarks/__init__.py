"""The project's benchmarks, run as modules from the checkout's root (see ``README.md`` here).

``results`` makes the tables the docs quote, ``probe`` the hidden-state probe's runs and
report, ``timing`` every timing behind one command; ``common`` and ``cache`` are shared.
"""
