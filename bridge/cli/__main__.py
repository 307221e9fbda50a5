"""``python -m bridge.cli``: the ``bridge`` command."""

from bridge.cli.root import main

if __name__ == "__main__":  # not on an import (a walk over the package's modules)
    main()
