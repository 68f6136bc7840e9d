"""``python -m torchdebug`` runs the command-line interface."""

from torchdebug.cli import main

raise SystemExit(main())
