import sys

from mlx_paged.cli.main import main

# Guarded: the engine process is spawned, and spawning imports this module again.
if __name__ == "__main__":
    sys.exit(main())
