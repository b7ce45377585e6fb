import sys

from mlx_paged.cli.main import main

sys.exit(main())
