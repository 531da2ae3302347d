"""``python -m esi_guard.cli``: the ``esi-guard`` command."""

from esi_guard.cli.commands import main

if __name__ == "__main__":
    main()
