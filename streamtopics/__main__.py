"""``python -m streamtopics``: the command line (``streamtopics``)."""
from .cli import main

raise SystemExit(main())
